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
	trees, err := NewTrees(t.TempDir()) // this host's boot id
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

// TestTreesVerify: a tree kept in this boot of the host is trusted as
// it is, by any process; one kept in an earlier boot is checked against
// its seal when first opened: a changed, truncated or missing file is
// data loss naming it, and so is a tree the host restarted before it
// was sealed. A tree never kept is not found.
func TestTreesVerify(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		unseal bool
		damage func(t *testing.T, files string)
		// lost: the open in a later boot is data loss, naming file.
		lost bool
		file string
	}{
		{name: "intact", damage: func(*testing.T, string) {}},
		{name: "not sealed", unseal: true, damage: func(*testing.T, string) {}, lost: true},
		{name: "changed", damage: func(t *testing.T, files string) {
			writeFile(t, filepath.Join(files, "memory/pages.img"), "pages of memorx")
		}, lost: true, file: "memory/pages.img"},
		{name: "truncated", damage: func(t *testing.T, files string) {
			if err := os.Truncate(filepath.Join(files, "memory/state.img"), 3); err != nil {
				t.Fatal(err)
			}
		}, lost: true, file: "memory/state.img"},
		{name: "missing", damage: func(t *testing.T, files string) {
			if err := os.Remove(filepath.Join(files, "data.tar")); err != nil {
				t.Fatal(err)
			}
		}, lost: true, file: "data.tar"},
		{name: "symlink retargeted", damage: func(t *testing.T, files string) {
			link := filepath.Join(files, "memory/latest")
			if err := os.Remove(link); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("state.img", link); err != nil {
				t.Fatal(err)
			}
		}, lost: true, file: "memory/latest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			kept, err := newTrees(root, "boot-1")
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
			if !tc.unseal {
				if err := kept.Seal(ctx, location); err != nil {
					t.Fatal(err)
				}
			}
			// Links share the source's inodes: damage the tree only, as
			// a crash of the host would.
			if err := os.RemoveAll(src); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, filepath.Join(root, location, treeFilesDir))
			// A new process in the same boot trusts it.
			same, err := newTrees(root, "boot-1")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := same.Open(ctx, location, digest); err != nil {
				t.Fatalf("open in the boot that kept it: %v", err)
			}
			// After a restart of the host, it is checked.
			later, err := newTrees(root, "boot-2")
			if err != nil {
				t.Fatal(err)
			}
			_, err = later.Open(ctx, location, digest)
			var loss *DataLossError
			switch {
			case !tc.lost && err != nil:
				t.Fatalf("open of an intact sealed tree in a later boot: %v", err)
			case tc.lost && !errors.As(err, &loss):
				t.Fatalf("open in a later boot: %v, want data loss", err)
			case tc.lost && (loss.File != tc.file || loss.Location != location):
				t.Fatalf("data loss names %q of %s, want %q of %s: %v", loss.File, loss.Location, tc.file, location, err)
			}
		})
	}
	t.Run("never kept", func(t *testing.T) {
		trees, err := newTrees(t.TempDir(), "boot-1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := trees.Open(ctx, "s/actor-1/none", "sha256:"+chunkSHA256(nil)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("open of a tree never kept: %v, want not found", err)
		}
	})
}

// TestTreesSeal: Unsealed lists this boot's trees not sealed; Seal is
// idempotent and does nothing for a tree deleted.
func TestTreesSeal(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	src := t.TempDir()
	writeTree(t, src, keptTree())
	earlier, err := newTrees(root, "boot-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := earlier.Keep(ctx, "s/a0/p1", src); err != nil {
		t.Fatal(err)
	}
	trees, err := newTrees(root, "boot-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"s/a1/p1", "s/a2/p1"} {
		if _, _, err := trees.Keep(ctx, l, src); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := trees.Seal(ctx, "s/a1/p1"); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := trees.Unsealed(); err != nil || !slices.Equal(got, []string{"s/a2/p1"}) {
		t.Fatalf("Unsealed() = %v, %v; want [s/a2/p1] (s/a0/p1 is an earlier boot's)", got, err)
	}
	if err := trees.Delete("s/a2/p1"); err != nil {
		t.Fatal(err)
	}
	if err := trees.Seal(ctx, "s/a2/p1"); err != nil {
		t.Fatalf("seal of a deleted tree: %v", err)
	}
	if got, err := trees.Unsealed(); err != nil || len(got) != 0 {
		t.Fatalf("Unsealed() = %v, %v; want none", got, err)
	}
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

// TestTreesSegments: a file of several pieces is sealed piece by piece;
// damage in a later piece, or a file cut short, is data loss naming the
// file after a restart of the host.
func TestTreesSegments(t *testing.T) {
	ctx := context.Background()
	size := int64(2*treeSegment + treeSegment/2)
	for _, tc := range []struct {
		name   string
		damage func(f *os.File) error
	}{
		{"byte flipped in the second segment", func(f *os.File) error {
			_, err := f.WriteAt([]byte{0xff}, treeSegment+12345)
			return err
		}},
		{"cut in the last segment", func(f *os.File) error { return f.Truncate(size - 1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, src := t.TempDir(), t.TempDir()
			trees, err := newTrees(root, "boot-1")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(src, "pages.img"), make([]byte, size), 0o600); err != nil {
				t.Fatal(err)
			}
			const location = "s/actor-1/pause-1"
			digest, _, err := trees.Keep(ctx, location, src)
			if err != nil {
				t.Fatal(err)
			}
			if err := trees.Seal(ctx, location); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(src); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(filepath.Join(root, location, treeFilesDir, "pages.img"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.damage(f); err != nil {
				t.Fatal(err)
			}
			f.Close()
			reopened, err := newTrees(root, "boot-2")
			if err != nil {
				t.Fatal(err)
			}
			var loss *DataLossError
			if _, err := reopened.Open(ctx, location, digest); !errors.As(err, &loss) || loss.File != "pages.img" {
				t.Fatalf("open of a damaged tree: %v, want data loss naming pages.img", err)
			}
		})
	}
}
