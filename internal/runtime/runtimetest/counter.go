package runtimetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/torpor-dev/torpor/internal/image"
)

// exampleImages are the examples' pinned image references, built once per
// test process.
var exampleImages sync.Map // example name -> *exampleImage

type exampleImage struct {
	once   sync.Once
	pinned string
	err    error
}

// CounterImage returns the pinned reference of the counter example's
// image, building its layout (as `make images` does) when it is missing.
func CounterImage(t testing.TB) string { return ExampleImage(t, "counter") }

// PodImage returns the pinned reference of the pod example's image (kv, a
// Redis-like server, and the counter's sidecar), building its layout (as
// `make images` does) when it is missing.
func PodImage(t testing.TB) string { return ExampleImage(t, "pod") }

// ExampleImage returns the pinned reference of the image examples/<name>
// builds with its mkimage command into examples/<name>/image, building it
// when it is missing.
func ExampleImage(t testing.TB, name string) string {
	t.Helper()
	v, _ := exampleImages.LoadOrStore(name, &exampleImage{})
	img := v.(*exampleImage)
	img.once.Do(func() {
		root, err := ModuleRoot()
		if err != nil {
			img.err = err
			return
		}
		layout := filepath.Join(root, "examples", name, "image")
		if _, err := os.Stat(filepath.Join(layout, "index.json")); err != nil {
			cmd := exec.Command("go", "run", "./examples/"+name+"/mkimage", "-out", layout, "-tag", "latest")
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				img.err = fmt.Errorf("build the %s image (make images): %w: %s", name, err, out)
				return
			}
		}
		img.pinned, img.err = image.Resolve(context.Background(), image.LayoutScheme+layout+":latest", "")
	})
	if img.err != nil {
		t.Fatal(img.err)
	}
	return img.pinned
}

// ModuleRoot is the directory of go.mod above the working directory.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
		dir = parent
	}
}
