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

var counter struct {
	once   sync.Once
	pinned string
	err    error
}

// CounterImage returns the pinned reference of the counter example's
// image, building its layout (as `make images` does) when it is missing.
func CounterImage(t testing.TB) string {
	t.Helper()
	counter.once.Do(func() {
		root, err := ModuleRoot()
		if err != nil {
			counter.err = err
			return
		}
		layout := filepath.Join(root, "examples", "counter", "image")
		if _, err := os.Stat(filepath.Join(layout, "index.json")); err != nil {
			cmd := exec.Command("go", "run", "./examples/counter/mkimage", "-out", layout, "-tag", "latest")
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				counter.err = fmt.Errorf("build the counter image (make images): %w: %s", err, out)
				return
			}
		}
		counter.pinned, counter.err = image.Resolve(context.Background(), image.LayoutScheme+layout+":latest", "")
	})
	if counter.err != nil {
		t.Fatal(counter.err)
	}
	return counter.pinned
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
