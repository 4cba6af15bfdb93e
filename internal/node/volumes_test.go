package node

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestVolumeArchiveRoundTrip(t *testing.T) {
	src := t.TempDir()
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	files := map[string]string{
		"data/requests.log":       "request 1\nrequest 2\n",
		"data/nested/deep/a.txt":  "a",
		"cache/blob":              strings.Repeat("x", 100_000),
		"data/nested/executable":  "#!/bin/sh\n",
		"data/name with spaces ü": "unicode",
	}
	for name, content := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(src, "data/nested/executable"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("requests.log", filepath.Join(src, "data/latest")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "data/empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), dataArchive)
	if err := archiveVolumes(src, []string{"data", "cache"}, archive); err != nil {
		t.Fatal(err)
	}

	root := filepath.Join(t.TempDir(), "actor")
	// Whatever the actor's volume directory held before is replaced.
	if err := os.MkdirAll(filepath.Join(root, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "data", "stale"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	dirs, err := prepareVolumes(context.Background(), root, []string{"data", "cache", "fresh"}, archive)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"data", "cache", "fresh"} {
		if want := filepath.Join(root, v); dirs[v] != want {
			t.Errorf("volume %s at %q, want %q", v, dirs[v], want)
		}
		if fi, err := os.Stat(dirs[v]); err != nil || !fi.IsDir() {
			t.Errorf("volume %s: not a directory: %v", v, err)
		}
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		got, err := os.ReadFile(p)
		if err != nil || string(got) != content {
			t.Errorf("%s: got %q, %v; want %q", name, got, err, content)
			continue
		}
		fi, _ := os.Stat(p)
		if !fi.ModTime().Equal(mtime) {
			t.Errorf("%s: mtime %v, want %v", name, fi.ModTime(), mtime)
		}
	}
	if fi, _ := os.Stat(filepath.Join(root, "data/nested/executable")); fi.Mode().Perm() != 0o755 {
		t.Errorf("executable mode %v, want 0755", fi.Mode().Perm())
	}
	if fi, _ := os.Stat(filepath.Join(root, "data/requests.log")); fi.Mode().Perm() != 0o640 {
		t.Errorf("log mode %v, want 0640", fi.Mode().Perm())
	}
	if target, err := os.Readlink(filepath.Join(root, "data/latest")); err != nil || target != "requests.log" {
		t.Errorf("symlink: %q, %v", target, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "data/empty")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("empty dir: %v, %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(root, "data", "stale")); !os.IsNotExist(err) {
		t.Errorf("stale file survived the restore: %v", err)
	}
}

func TestVolumeArchiveRejectsEscapes(t *testing.T) {
	type entry struct {
		name, link string
		typ        byte
	}
	tests := []struct {
		name    string
		entries []entry
		wantErr string
	}{
		{"dot-dot", []entry{{name: "data/../../etc/passwd", typ: tar.TypeReg}}, "bad path segment"},
		{"absolute", []entry{{name: "/etc/passwd", typ: tar.TypeReg}}, "not a relative path"},
		{"through symlink", []entry{{name: "data", typ: tar.TypeDir}, {name: "data/out", link: "/etc", typ: tar.TypeSymlink}, {name: "data/out/passwd", typ: tar.TypeReg}}, "through a symlink"},
		{"device", []entry{{name: "data", typ: tar.TypeDir}, {name: "data/null", typ: tar.TypeChar}}, "unsupported type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			archive := filepath.Join(t.TempDir(), "bad.tar")
			f, err := os.Create(archive)
			if err != nil {
				t.Fatal(err)
			}
			tw := tar.NewWriter(f)
			for _, e := range tt.entries {
				hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644}
				if err := tw.WriteHeader(hdr); err != nil {
					t.Fatal(err)
				}
			}
			tw.Close()
			f.Close()
			root := filepath.Join(t.TempDir(), "actor")
			_, err = prepareVolumes(context.Background(), root, []string{"data"}, archive)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
			}
			if _, err := os.Stat(root); !os.IsNotExist(err) {
				t.Errorf("a failed extraction left %s behind: %v", root, err)
			}
		})
	}
}
