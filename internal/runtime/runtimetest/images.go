package runtimetest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/torpor-dev/torpor/internal/image"
)

// ImagePolicy is the image policy of servers and nodes under test: local
// images under ImageDirs; no registry.
func ImagePolicy(t testing.TB) *image.Policy {
	t.Helper()
	p, err := image.NewPolicy(image.PolicyConfig{Dirs: ImageDirs(t)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ImageDirs are the directories of the images tests use: the examples'
// and the temporary directory tests write theirs in.
func ImageDirs(t testing.TB) []string {
	t.Helper()
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return []string{filepath.Join(root, "examples"), os.TempDir()}
}
