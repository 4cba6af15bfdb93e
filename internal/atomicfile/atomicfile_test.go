package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "f")
	for _, tc := range []struct {
		data string
		mode os.FileMode
	}{
		{"first", 0o600},
		{"second, longer than the first", 0o644},
		{"3", 0o600},
	} {
		if err := Write(path, []byte(tc.data), tc.mode); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != tc.data {
			t.Fatalf("read %q, %v; want %q", got, err, tc.data)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != tc.mode {
			t.Errorf("mode %v, want %v", fi.Mode().Perm(), tc.mode)
		}
	}
	entries, err := os.ReadDir(filepath.Join(dir, "sub"))
	if err != nil || len(entries) != 1 {
		t.Errorf("directory holds %v (%v), want only the file: no temporary left", entries, err)
	}
	if err := Write(filepath.Join(path, "below-a-file"), nil, 0o600); err == nil {
		t.Error("writing below a regular file succeeded")
	}
}
