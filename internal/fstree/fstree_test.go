package fstree

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func open(t *testing.T, dir string) *Root {
	t.Helper()
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

type entry struct {
	name, link, body string
	typ              byte
	mode             int64
}

func archive(t *testing.T, entries ...entry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: mode, Size: int64(len(e.body))}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func TestWriteTarExtractRoundTrip(t *testing.T) {
	src := t.TempDir()
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	files := map[string]fs.FileMode{
		"a.txt":              0o640,
		"nested/deep/b.txt":  0o600,
		"nested/exe":         0o755 | fs.ModeSetuid,
		"name with spaces ü": 0o644,
	}
	if err := os.MkdirAll(filepath.Join(src, "nested/deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, mode := range files {
		p := filepath.Join(src, name)
		if err := os.WriteFile(p, []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a.txt", filepath.Join(src, "latest")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "ro"), 0o555); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a.txt", "nested/deep/b.txt", "nested/exe", "name with spaces ü", "nested/deep", "nested", "ro"} {
		if err := os.Chtimes(filepath.Join(src, p), mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := WriteTar(tw, open(t, src), "vol"); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	if err := Extract(context.Background(), open(t, dest), &buf); err != nil {
		t.Fatal(err)
	}
	for name, mode := range files {
		p := filepath.Join(dest, "vol", name)
		got, err := os.ReadFile(p)
		if err != nil || string(got) != name {
			t.Errorf("%s = %q, %v", name, got, err)
			continue
		}
		fi, _ := os.Lstat(p)
		if fi.Mode() != mode || !fi.ModTime().Equal(mtime) {
			t.Errorf("%s: mode %v, mtime %v; want %v, %v", name, fi.Mode(), fi.ModTime(), mode, mtime)
		}
	}
	for _, d := range []string{"nested", "nested/deep", "ro"} {
		if fi, err := os.Stat(filepath.Join(dest, "vol", d)); err != nil || !fi.ModTime().Equal(mtime) {
			t.Errorf("directory %s: %v, %v; want mtime %v once its entries are written", d, fi, err, mtime)
		}
	}
	if fi, err := os.Stat(filepath.Join(dest, "vol/ro")); err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("ro = %v, %v; want mode 0555", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(dest, "vol/latest")); err != nil || target != "a.txt" {
		t.Errorf("symlink latest = %q, %v", target, err)
	}
}

func TestWriteTarSkipsSpecialFiles(t *testing.T) {
	src := t.TempDir()
	r := open(t, src)
	if err := r.mkfifo("pipe", 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := WriteTar(tw, r, "v"); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	var names []string
	tr := tar.NewReader(&buf)
	for hdr, err := tr.Next(); err == nil; hdr, err = tr.Next() {
		names = append(names, hdr.Name)
	}
	if got := strings.Join(names, ","); got != "v,v/f" {
		t.Errorf("archived %s, want v,v/f", got)
	}
}

// TestRejects: a data archive may hold nothing but plain names of
// directories, files and symlinks; a layer's names and links resolve as the
// guest reads them; neither reaches anything outside its root.
func TestRejects(t *testing.T) {
	type extract func(context.Context, *Root, io.Reader) error
	tests := []struct {
		name    string
		extract extract
		entries []entry
		wantErr string
	}{
		{"dot-dot", Extract, []entry{{name: "data/../../etc/passwd", typ: tar.TypeReg}}, "bad path segment"},
		{"absolute", Extract, []entry{{name: "/etc/passwd", typ: tar.TypeReg}}, "not a relative path"},
		{"dot", Extract, []entry{{name: "./data", typ: tar.TypeDir}}, "bad path segment"},
		{"through symlink", Extract, []entry{{name: "data", typ: tar.TypeDir}, {name: "data/out", link: "/etc", typ: tar.TypeSymlink}, {name: "data/out/passwd", typ: tar.TypeReg}}, "through a symlink"},
		{"through relative symlink", Extract, []entry{{name: "in", link: ".", typ: tar.TypeSymlink}, {name: "in/x", typ: tar.TypeReg}}, "through a symlink"},
		{"device", Extract, []entry{{name: "data", typ: tar.TypeDir}, {name: "data/null", typ: tar.TypeChar}}, "unsupported type"},
		{"hard link", Extract, []entry{{name: "h", link: "/etc/passwd", typ: tar.TypeLink}}, "unsupported type"},
		{"fifo", Extract, []entry{{name: "p", typ: tar.TypeFifo}}, "unsupported type"},
		{"layer dot-dot entry", ApplyLayer, []entry{{name: "../evil", typ: tar.TypeReg}}, `entry "../evil": points outside`},
		{"layer dot-dot inside entry", ApplyLayer, []entry{{name: "a/", typ: tar.TypeDir}, {name: "a/../../evil", typ: tar.TypeReg}}, "points outside"},
		{"layer hard link out", ApplyLayer, []entry{{name: "h", link: "../../../etc/passwd", typ: tar.TypeLink}}, "points outside"},
		{"layer hard link to root", ApplyLayer, []entry{{name: "h", link: "/", typ: tar.TypeLink}}, "hard link to the root"},
		{"layer symlink loop", ApplyLayer, []entry{{name: "loop", link: "loop", typ: tar.TypeSymlink}, {name: "loop/x", typ: tar.TypeReg}}, "too many levels of symbolic links"},
		{"layer whiteout of the parent", ApplyLayer, []entry{{name: "a/", typ: tar.TypeDir}, {name: "a/.wh..", typ: tar.TypeReg}}, "whiteout of no file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			dest := filepath.Join(base, "root")
			if err := os.Mkdir(dest, 0o755); err != nil {
				t.Fatal(err)
			}
			err := tt.extract(context.Background(), open(t, dest), archive(t, tt.entries...))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
			}
			assertOnly(t, base, "root")
		})
	}
}

// TestExtractReplacesSymlink: an entry named as a symlink the archive made
// replaces the symlink; it never changes the symlink's target.
func TestExtractReplacesSymlink(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.Mkdir(outside, 0o700); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(base, "root")
	if err := os.Mkdir(dest, 0o755); err != nil {
		t.Fatal(err)
	}
	err := Extract(context.Background(), open(t, dest), archive(t,
		entry{name: "d", link: outside, typ: tar.TypeSymlink},
		entry{name: "d", typ: tar.TypeDir, mode: 0o777},
		entry{name: "f", link: outside, typ: tar.TypeSymlink},
		entry{name: "f", typ: tar.TypeReg, body: "data", mode: 0o666},
	))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(outside); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("outside = %v, %v; want it untouched (0700)", fi, err)
	}
	if fi, err := os.Lstat(filepath.Join(dest, "d")); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 {
		t.Errorf("d = %v, %v; want a directory 0777", fi, err)
	}
	if got, err := os.ReadFile(filepath.Join(dest, "f")); err != nil || string(got) != "data" {
		t.Errorf("f = %q, %v", got, err)
	}
}

func TestApplyLayerSkipsDevices(t *testing.T) {
	dest := t.TempDir()
	err := ApplyLayer(context.Background(), open(t, dest), archive(t,
		entry{name: "dev/", typ: tar.TypeDir},
		entry{name: "dev/null", typ: tar.TypeChar},
		entry{name: "dev/sda", typ: tar.TypeBlock},
	))
	if err != nil {
		t.Fatal(err)
	}
	if des, err := os.ReadDir(filepath.Join(dest, "dev")); err != nil || len(des) != 0 {
		t.Errorf("dev holds %v, %v; want it empty", des, err)
	}
}

func TestResolve(t *testing.T) {
	dest := t.TempDir()
	r := open(t, dest)
	for _, l := range []struct{ name, target string }{
		{"abs", "/usr/lib"},
		{"up", "../../.."},
		{"rel", "usr/lib"},
		{"chain", "abs"},
		{"loop", "loop"},
	} {
		if err := os.Symlink(l.target, filepath.Join(dest, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dest, "usr/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ in, want, wantErr string }{
		{in: "", want: "."},
		{in: "abs/x", want: "usr/lib/x"},
		{in: "up/etc/passwd", want: "etc/passwd"},
		{in: "../../etc", want: "etc"},
		{in: "rel/../bin", want: "usr/bin"},
		{in: "chain", want: "usr/lib"},
		{in: "missing/abs", want: "missing/abs"},
		{in: "loop/x", wantErr: "too many levels"},
	}
	for _, tt := range tests {
		got, err := r.Resolve(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Resolve(%q) = %q, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

// TestSetAttrsSymlink: a symlink's own times change, never its target's.
func TestSetAttrsSymlink(t *testing.T) {
	dest := t.TempDir()
	target := filepath.Join(dest, "target")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("target", filepath.Join(dest, "link")); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	if err := open(t, dest).SetAttrs("link", Attrs{Mode: 0o777, ModTime: mtime}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dest, "link")); err != nil || !fi.ModTime().Equal(mtime) {
		t.Errorf("link = %v, %v; want mtime %v", fi, err, mtime)
	}
	after, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if after.Mode() != before.Mode() || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("target changed: %v %v, was %v %v", after.Mode(), after.ModTime(), before.Mode(), before.ModTime())
	}
}

// assertOnly checks that dir holds nothing but the named entries.
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, de := range des {
		got = append(got, de.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("%s holds %v, want %v: an entry was written outside the root", dir, got, names)
	}
}
