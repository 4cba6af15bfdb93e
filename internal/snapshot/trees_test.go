package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func keptTree() []treeEntry {
	return []treeEntry{
		{path: ".", mode: 0o755, dir: true},
		{path: "memory", mode: 0o755, dir: true},
		{path: "memory/pages.img", mode: 0o600, content: "pages of memory"},
		{path: "memory/state.img", mode: 0o600, content: "kernel state"},
		{path: "memory/latest", mode: 0o777, target: "pages.img"},
		{path: "data.tar", mode: 0o644, content: "volumes"},
		{path: "empty", mode: 0o644, content: ""},
	}
}

// TestTreesKeepOpen: a kept tree opens as the same files, read in place;
// the source is left as it was; keeping at the same location again
// replaces it.
func TestTreesKeepOpen(t *testing.T) {
	ctx := context.Background()
	trees, err := NewTrees(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	writeTree(t, src, keptTree())
	want := readTree(t, src)
	const location = "s/actor-1/pause-1"
	digest, size, err := trees.Keep(ctx, location, src)
	if err != nil {
		t.Fatal(err)
	}
	if size < int64(len("pages of memorykernel statevolumes")) {
		t.Errorf("size %d, less than the files hold", size)
	}
	if got := readTree(t, src); !equalTrees(got, want) {
		t.Errorf("Keep changed its source: %v, was %v", got, want)
	}
	dir, err := trees.Open(ctx, location, digest)
	if err != nil {
		t.Fatal(err)
	}
	got := readTree(t, dir)
	for path, w := range want {
		if g := got[path]; g.content != w.content || g.target != w.target || g.mode.Type() != w.mode.Type() {
			t.Errorf("%s in the kept tree: %+v, want %+v", path, g, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("kept tree has %d paths, the source %d", len(got), len(want))
	}

	// Again (a retried checkpoint): replaced, the earlier digest gone.
	if err := os.WriteFile(filepath.Join(src, "data.tar"), []byte("volumes, later"), 0o644); err != nil {
		t.Fatal(err)
	}
	again, _, err := trees.Keep(ctx, location, src)
	if err != nil {
		t.Fatal(err)
	}
	if again == digest {
		t.Fatal("the second Keep kept the same manifest digest for other content")
	}
	if _, err := trees.Open(ctx, location, digest); !errors.Is(err, ErrDataLoss) {
		t.Errorf("open with the replaced digest: %v, want data loss", err)
	}
	if _, err := trees.Open(ctx, location, again); err != nil {
		t.Errorf("open the replacement: %v", err)
	}
}

// TestTreesVerify: a tree this process did not keep is checked against
// its manifest when first opened: a changed, truncated or missing file is
// data loss naming it; a tree never kept is not found.
func TestTreesVerify(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, files string)
		file   string // the file the data loss names; "" for none
	}{
		{"intact", func(*testing.T, string) {}, ""},
		{"changed", func(t *testing.T, files string) {
			writeFile(t, filepath.Join(files, "memory/pages.img"), "pages of memorx")
		}, "memory/pages.img"},
		{"truncated", func(t *testing.T, files string) {
			if err := os.Truncate(filepath.Join(files, "memory/state.img"), 3); err != nil {
				t.Fatal(err)
			}
		}, "memory/state.img"},
		{"missing", func(t *testing.T, files string) {
			if err := os.Remove(filepath.Join(files, "data.tar")); err != nil {
				t.Fatal(err)
			}
		}, "data.tar"},
		{"symlink retargeted", func(t *testing.T, files string) {
			link := filepath.Join(files, "memory/latest")
			if err := os.Remove(link); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("state.img", link); err != nil {
				t.Fatal(err)
			}
		}, "memory/latest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			kept, err := NewTrees(root)
			if err != nil {
				t.Fatal(err)
			}
			src := t.TempDir()
			writeTree(t, src, keptTree())
			const location = "s/actor-1/pause-1"
			digest, _, err := kept.Keep(ctx, location, src)
			if err != nil {
				t.Fatal(err)
			}
			// Links share the source's inodes: damage a copy of the tree
			// only, as a crash of the host would.
			if err := os.RemoveAll(src); err != nil {
				t.Fatal(err)
			}
			files := filepath.Join(root, location, treeFilesDir)
			tc.damage(t, files)
			// A new process (an agent restarted) verifies before use.
			reopened, err := NewTrees(root)
			if err != nil {
				t.Fatal(err)
			}
			_, err = reopened.Open(ctx, location, digest)
			var loss *DataLossError
			switch {
			case tc.file == "" && err != nil:
				t.Fatalf("open of an intact tree: %v", err)
			case tc.file != "" && !errors.As(err, &loss):
				t.Fatalf("open of a damaged tree: %v, want data loss", err)
			case tc.file != "" && (loss.File != tc.file || loss.Location != location):
				t.Fatalf("data loss names %s of %s, want %s of %s: %v", loss.File, loss.Location, tc.file, location, err)
			}
		})
	}
	t.Run("never kept", func(t *testing.T) {
		trees, err := NewTrees(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := trees.Open(ctx, "s/actor-1/none", "sha256:"+chunkSHA256(nil)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("open of a tree never kept: %v, want not found", err)
		}
	})
}

// TestTreesLocationsDelete: Locations lists kept trees under a prefix;
// Delete removes one with its emptied parents, and is idempotent; a new
// Trees removes what a Keep cut short left.
func TestTreesLocationsDelete(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	trees, err := NewTrees(root)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	writeTree(t, src, keptTree())
	for _, l := range []string{"s/a1/p1", "s/a1/p2", "s/a2/p1", "t/a3/p1"} {
		if _, _, err := trees.Keep(ctx, l, src); err != nil {
			t.Fatal(err)
		}
	}
	for prefix, want := range map[string][]string{
		"s/a1": {"s/a1/p1", "s/a1/p2"},
		"s":    {"s/a1/p1", "s/a1/p2", "s/a2/p1"},
		"s/a9": nil,
	} {
		got, err := trees.Locations(prefix)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("Locations(%q) = %v, want %v", prefix, got, want)
		}
	}
	for _, l := range []string{"s/a2/p1", "s/a2/p1"} {
		if err := trees.Delete(l); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "s", "a2")); !os.IsNotExist(err) {
		t.Errorf("s/a2 after its only tree's delete: %v, want it gone", err)
	}
	if _, err := os.Stat(filepath.Join(root, "s", "a1", "p1", manifestName)); err != nil {
		t.Errorf("a tree not deleted: %v", err)
	}
	if err := trees.Delete("../x"); err == nil {
		t.Error("Delete of a location outside the trees: no error")
	}

	cutShort := filepath.Join(root, treeIncoming, "keep-1", treeFilesDir)
	if err := os.MkdirAll(cutShort, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := NewTrees(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cutShort); !os.IsNotExist(err) {
		t.Errorf("what a cut-short Keep left: %v, want it removed", err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func equalTrees(a, b map[string]treeState) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
