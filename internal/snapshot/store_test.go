package snapshot

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestValidateKey(t *testing.T) {
	tests := []struct {
		key string
		ok  bool
	}{
		{"a", true},
		{"space/actor/snap/files/0.zst", true},
		{".hidden/x", true},
		{"", false},
		{"/etc/passwd", false},
		{"..", false},
		{"../x", false},
		{"a/../../x", false},
		{"a/./b", false},
		{"a//b", false},
		{"a/", false},
		{"a\\..\\b", false},
		{"a\x00b", false},
	}
	for _, tt := range tests {
		err := ValidateKey(tt.key)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateKey(%q) = %v, want ok=%v", tt.key, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ValidateKey(%q) = %v, want ErrInvalidKey", tt.key, err)
		}
	}
}

func newDirStore(t testing.TB) *DirStore {
	t.Helper()
	s, err := NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDirStoreRejectsUnsafeKeys(t *testing.T) {
	s := newDirStore(t)
	ctx := t.Context()
	outside := filepath.Join(filepath.Dir(s.Root()), "escaped")
	for _, key := range []string{"../escaped", "a/../../escaped", "/tmp/escaped", "a//b", ".incoming/x", ""} {
		if err := s.Put(ctx, key, strings.NewReader("x")); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Put(%q) = %v, want ErrInvalidKey", key, err)
		}
		if _, err := s.Get(ctx, key); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Get(%q) = %v, want ErrInvalidKey", key, err)
		}
		if err := s.Delete(ctx, key); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Delete(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
	if _, err := s.List(ctx, "../"); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("List(../) = %v, want ErrInvalidKey", err)
	}
	if _, err := os.Stat(outside); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file escaped the store root: %v", err)
	}
}

func TestDirStoreObjects(t *testing.T) {
	s := newDirStore(t)
	ctx := t.Context()
	put := func(key, body string) {
		t.Helper()
		if err := s.Put(ctx, key, strings.NewReader(body)); err != nil {
			t.Fatal(err)
		}
	}
	put("sp/a/1/manifest.json", "m1")
	put("sp/a/1/files/0.zst", "zero")
	put("sp/ab/2/manifest.json", "m2")
	put("sp/a/1/files/0.zst", "replaced")

	rc, err := s.Get(ctx, "sp/a/1/files/0.zst")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "replaced" {
		t.Errorf("Get after overwrite = %q, want %q", got, "replaced")
	}
	for _, missing := range []string{"sp/a/1/nope", "sp/a/1/manifest.json/x", "sp/a"} {
		if _, err := s.Get(ctx, missing); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%q) = %v, want ErrNotFound", missing, err)
		}
	}

	listTests := []struct {
		prefix string
		want   []string
	}{
		{"", []string{"sp/a/1/files/0.zst", "sp/a/1/manifest.json", "sp/ab/2/manifest.json"}},
		{"sp/a/", []string{"sp/a/1/files/0.zst", "sp/a/1/manifest.json"}},
		{"sp/a", []string{"sp/a/1/files/0.zst", "sp/a/1/manifest.json", "sp/ab/2/manifest.json"}},
		{"sp/a/1/man", []string{"sp/a/1/manifest.json"}},
		{"other/", nil},
	}
	for _, tt := range listTests {
		infos, err := s.List(ctx, tt.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", tt.prefix, err)
		}
		var keys []string
		for _, o := range infos {
			keys = append(keys, o.Key)
			if o.ModTime.IsZero() {
				t.Errorf("List(%q): %s has no modification time", tt.prefix, o.Key)
			}
		}
		if !slices.Equal(keys, tt.want) {
			t.Errorf("List(%q) = %v, want %v", tt.prefix, keys, tt.want)
		}
	}

	for _, key := range []string{"sp/a/1/files/0.zst", "sp/a/1/manifest.json", "sp/a/1/manifest.json"} {
		if err := s.Delete(ctx, key); err != nil {
			t.Fatalf("Delete(%q): %v", key, err)
		}
	}
	if _, err := os.Stat(filepath.Join(s.Root(), "sp", "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("emptied directories are not pruned: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.Root(), "sp", "ab", "2")); err != nil {
		t.Errorf("pruning removed a non-empty sibling: %v", err)
	}
}

// failingReader yields some bytes, then fails like a broken connection.
type failingReader struct{ sent bool }

func (f *failingReader) Read(p []byte) (int, error) {
	if !f.sent {
		f.sent = true
		return copy(p, bytes.Repeat([]byte("x"), 1000)), nil
	}
	return 0, errors.New("connection reset")
}

func TestDirStorePutFailureLeavesNothing(t *testing.T) {
	s := newDirStore(t)
	ctx := t.Context()
	if err := s.Put(ctx, "sp/a/1/files/0.zst", &failingReader{}); err == nil {
		t.Fatal("Put from a failing reader succeeded")
	}
	if _, err := s.Get(ctx, "sp/a/1/files/0.zst"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after failed Put = %v, want ErrNotFound", err)
	}
	if objs, err := s.List(ctx, ""); err != nil || len(objs) != 0 {
		t.Errorf("List after failed Put = %v, %v; want nothing", objs, err)
	}
	if names, _ := os.ReadDir(filepath.Join(s.Root(), incomingDir)); len(names) != 0 {
		t.Errorf("temporary files left behind: %v", names)
	}
}

// Opening a store another process shares (server and node agents open one
// directory) must not break that process's put in progress, yet clears
// what a crashed put left long ago.
func TestNewDirStoreKeepsPutsInProgress(t *testing.T) {
	s := newDirStore(t)
	incoming := filepath.Join(s.Root(), incomingDir)
	fresh, stale := filepath.Join(incoming, "put-fresh"), filepath.Join(incoming, "put-stale")
	for _, f := range []string{fresh, stale} {
		if err := os.WriteFile(f, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * staleIncoming)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := NewDirStore(s.Root()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a put in progress was removed: %v", err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a stale leftover was kept: %v", err)
	}
	if err := s.Put(t.Context(), "sp/a/1/manifest.json", strings.NewReader("{}")); err != nil {
		t.Errorf("put after another open: %v", err)
	}
}
