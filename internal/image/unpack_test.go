package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func pinnedHex(pinned string) string {
	return pinned[strings.LastIndex(pinned, ":")+1:]
}

// layoutWith writes a single-image layout and returns its pinned reference.
func layoutWith(t *testing.T, img v1.Image) (pinned, dir string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "layout")
	writeLayout(t, dir, tagged{img: img})
	return "oci:" + dir + "@" + digestOf(t, img).String(), dir
}

func TestUnpackAppliesLayers(t *testing.T) {
	// Symlinks in the layers point at these host directories, so an unpack
	// that followed them on the host would write only where the test looks.
	base := t.TempDir()
	cache := filepath.Join(base, "x", "y")
	hostDir := filepath.Join(base, "host")
	if err := os.Mkdir(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	lower := layer(t,
		dir(hostDir[1:]+"/"),
		dir("etc/"),
		file("etc/passwd", "root"),
		dir("keep/"),
		file("keep/a", "a"),
		hardlink("keep/hard", "keep/a"),
		dir("gone/"),
		file("gone/x", "x"),
		dir("opq/"),
		file("opq/old", "old"),
		dir("opq/sub/"),
		file("opq/sub/deep", "deep"),
		file("del", "del"),
		symlink("abs", hostDir),
		symlink("up", "../../../.."),
		symlink("abs2", "abs"),
		entry{name: "modes/suid", body: "s", mode: 0o4755},
		entry{name: "modes/private", body: "p", mode: 0o640},
		entry{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		file("ro/f", "f"),
		entry{name: "fifo", typ: tar.TypeFifo, mode: 0o600},
	)
	upper := layer(t,
		file(".wh.del", ""),
		file(".wh.gone", ""),
		// The opaque marker comes after an entry of its own layer: it must
		// hide only what lower layers put there.
		file("opq/new", "new"),
		file("opq/.wh..wh..opq", ""),
		dir("opq/sub/"),
		file("opq/sub/fresh", "fresh"),
		file("abs/hosts", "through an absolute symlink"),
		file("abs2/hosts2", "through a symlink to a symlink"),
		file("up/escaped", "through a climbing symlink"),
		file("/slash", "leading slash"),
		file("./dot", "leading dot"),
		file("ro/g", "into a read-only dir"),
	)
	pinned, _ := layoutWith(t, imageOf(t, v1.Config{}, lower, upper))
	rootfs, err := anywhere.Unpack(context.Background(), pinned, cache)
	if err != nil {
		t.Fatalf("Unpack: %v", err)
	}
	if want := filepath.Join(cache, pinnedHex(pinned), "rootfs"); rootfs != want {
		t.Fatalf("rootfs = %q, want %q", rootfs, want)
	}

	const absent = "\x00absent"
	files := []struct {
		path string
		want string // content, or absent
		mode fs.FileMode
	}{
		{path: "etc/passwd", want: "root", mode: 0o644},
		{path: "keep/a", want: "a", mode: 0o644},
		{path: "keep/hard", want: "a", mode: 0o644},
		{path: "gone", want: absent},
		{path: "del", want: absent},
		{path: "opq/old", want: absent},
		{path: "opq/sub/deep", want: absent},
		{path: "opq/new", want: "new", mode: 0o644},
		{path: "opq/sub/fresh", want: "fresh", mode: 0o644},
		{path: hostDir[1:] + "/hosts", want: "through an absolute symlink", mode: 0o644},
		{path: hostDir[1:] + "/hosts2", want: "through a symlink to a symlink", mode: 0o644},
		{path: "escaped", want: "through a climbing symlink", mode: 0o644},
		{path: "slash", want: "leading slash", mode: 0o644},
		{path: "dot", want: "leading dot", mode: 0o644},
		{path: "modes/suid", want: "s", mode: 0o755 | fs.ModeSetuid},
		{path: "modes/private", want: "p", mode: 0o640},
		{path: "ro/g", want: "into a read-only dir", mode: 0o644},
	}
	for _, f := range files {
		p := filepath.Join(rootfs, f.path)
		fi, err := os.Lstat(p)
		if f.want == absent {
			if !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s: want it whited out, Lstat = %v, %v", f.path, fi, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", f.path, err)
			continue
		}
		if got := mustRead(t, p); got != f.want {
			t.Errorf("%s = %q, want %q", f.path, got, f.want)
		}
		if got := fi.Mode(); got != f.mode {
			t.Errorf("%s mode = %v, want %v", f.path, got, f.mode)
		}
	}
	links := map[string]string{"abs": hostDir, "abs2": "abs", "up": "../../../.."}
	for p, want := range links {
		if got, err := os.Readlink(filepath.Join(rootfs, p)); err != nil || got != want {
			t.Errorf("symlink %s = %q, %v; want %q", p, got, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "ro")); err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("ro dir = %v, %v; want mode 0555", fi, err)
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, "fifo")); err != nil || fi.Mode().Type() != fs.ModeNamedPipe {
		t.Errorf("fifo = %v, %v; want a named pipe", fi, err)
	}
	a, errA := os.Stat(filepath.Join(rootfs, "keep/a"))
	h, errH := os.Stat(filepath.Join(rootfs, "keep/hard"))
	if errA != nil || errH != nil || !os.SameFile(a, h) {
		t.Errorf("keep/hard is not a hard link of keep/a (%v, %v)", errA, errH)
	}
	if des, err := os.ReadDir(hostDir); err != nil || len(des) != 0 {
		t.Errorf("host directory %s: %v, %v; want it empty", hostDir, des, err)
	}
	for d := filepath.Dir(rootfs); d != filepath.Dir(base); d = filepath.Dir(d) {
		if _, err := os.Lstat(filepath.Join(d, "escaped")); err == nil {
			t.Errorf("escaped was written to %s, outside the root filesystem", d)
		}
	}
	assertOnlyRootfs(t, filepath.Dir(rootfs))
}

// assertOnlyRootfs checks that a cache entry holds the finished root
// filesystem, the image's config and the lock, and no leftovers of an
// extraction.
func assertOnlyRootfs(t *testing.T, entry string) {
	t.Helper()
	des, err := os.ReadDir(entry)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "config.json,lock,rootfs" {
		t.Fatalf("cache entry %s holds %v, want [config.json lock rootfs]", entry, names)
	}
}

func TestUnpackRejectsEscapes(t *testing.T) {
	tests := []struct {
		name    string
		entries []entry
		wantErr string
	}{
		{name: "dot-dot entry", entries: []entry{file("../evil", "x")}, wantErr: `entry "../evil": points outside`},
		{name: "dot-dot inside entry", entries: []entry{dir("a/"), file("a/../../evil", "x")}, wantErr: "points outside"},
		{name: "hard link out", entries: []entry{hardlink("h", "../../../etc/passwd")}, wantErr: "points outside"},
		{name: "hard link to root", entries: []entry{hardlink("h", "/")}, wantErr: "hard link to the root"},
		{name: "symlink loop", entries: []entry{symlink("loop", "loop"), file("loop/x", "x")}, wantErr: "too many levels of symbolic links"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pinned, _ := layoutWith(t, imageOf(t, v1.Config{}, layer(t, tc.entries...)))
			cache := t.TempDir()
			rootfs, err := anywhere.Unpack(context.Background(), pinned, cache)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), pinned) {
				t.Fatalf("Unpack = %q, %v; want an error naming the image and containing %q", rootfs, err, tc.wantErr)
			}
			entry := filepath.Join(cache, pinnedHex(pinned))
			des, err := os.ReadDir(entry)
			if err != nil {
				t.Fatal(err)
			}
			for _, de := range des {
				if de.Name() != "lock" {
					t.Errorf("failed unpack left %s in the cache", de.Name())
				}
			}
			if _, err := os.Lstat(filepath.Join(cache, "evil")); err == nil {
				t.Errorf("an entry was written outside the root filesystem")
			}
		})
	}
}

func TestUnpackVerifiesDigests(t *testing.T) {
	img := imageOf(t, v1.Config{Cmd: []string{"run"}}, layer(t, file("data", "precious content")))
	manifest, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	unpack := func(ctx context.Context, pinned string) error {
		_, err := anywhere.Unpack(ctx, pinned, t.TempDir())
		return err
	}
	config := func(ctx context.Context, pinned string) error {
		_, err := anywhere.Config(ctx, pinned)
		return err
	}
	tests := []struct {
		name string
		blob v1.Hash
		call func(context.Context, string) error
	}{
		{name: "layer", blob: manifest.Layers[0].Digest, call: unpack},
		{name: "manifest on unpack", blob: digestOf(t, img), call: unpack},
		{name: "manifest on config", blob: digestOf(t, img), call: config},
		{name: "config", blob: manifest.Config.Digest, call: config},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pinned, dir := layoutWith(t, img)
			p := filepath.Join(dir, "blobs", "sha256", tc.blob.Hex)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.call(context.Background(), pinned); err != nil {
				t.Fatalf("intact blob: %v", err)
			}
			// Same size, one byte changed: only the digest can tell.
			i := bytes.Index(b, []byte("precious"))
			if i < 0 {
				i = len(b) / 2
			}
			b[i] ^= 0x01
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			err = tc.call(context.Background(), pinned)
			if err == nil || !strings.Contains(err.Error(), "is corrupt") || !strings.Contains(err.Error(), tc.blob.String()) {
				t.Fatalf("corrupt %s blob: err = %v, want a corruption error naming %s", tc.name, err, tc.blob)
			}
		})
	}
}

func TestUnpackCacheHit(t *testing.T) {
	ctx := context.Background()
	pinned, dir := layoutWith(t, imageOf(t, v1.Config{}, layer(t, file("f", "content"))))
	cache := t.TempDir()
	first, err := anywhere.Unpack(ctx, pinned, cache)
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(first, "marker")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// With the source gone, only the cache can answer.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	second, err := anywhere.Unpack(ctx, pinned, cache)
	if err != nil {
		t.Fatalf("second Unpack: %v", err)
	}
	if second != first {
		t.Fatalf("second Unpack = %q, want %q", second, first)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("second Unpack extracted again: %v", err)
	}
	if _, err := anywhere.Unpack(ctx, pinned, t.TempDir()); err == nil {
		t.Fatal("Unpack into an empty cache with the source gone succeeded")
	}
}

func TestUnpackConcurrent(t *testing.T) {
	var entries []entry
	for i := range 200 {
		entries = append(entries, file(fmt.Sprintf("files/f%03d", i), strings.Repeat("y", i)))
	}
	pinned, _ := layoutWith(t, imageOf(t, v1.Config{}, layer(t, entries...)))
	cache := t.TempDir()
	const callers = 8
	results := make([]string, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			results[i], errs[i] = anywhere.Unpack(context.Background(), pinned, cache)
		})
	}
	wg.Wait()
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if results[i] != results[0] {
			t.Fatalf("caller %d got %q, caller 0 %q", i, results[i], results[0])
		}
	}
	des, err := os.ReadDir(filepath.Join(results[0], "files"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, e := range entries {
		want[e.name] = true
	}
	if len(des) != len(want) {
		t.Fatalf("rootfs has %d files, want %d", len(des), len(want))
	}
	assertOnlyRootfs(t, filepath.Dir(results[0]))
}

func TestUnpackRemovesStaleExtraction(t *testing.T) {
	img := imageOf(t, v1.Config{}, layer(t, file("f", "content")))
	pinned, _ := layoutWith(t, img)
	cache := t.TempDir()
	stale := filepath.Join(cache, digestOf(t, img).Hex, "rootfs.tmp-died")
	if err := os.MkdirAll(filepath.Join(stale, "half"), 0o755); err != nil {
		t.Fatal(err)
	}
	rootfs, err := anywhere.Unpack(context.Background(), pinned, cache)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, filepath.Join(rootfs, "f")); got != "content" {
		t.Fatalf("f = %q", got)
	}
	assertOnlyRootfs(t, filepath.Dir(rootfs))
}

func TestUnpackNeedsPinnedRef(t *testing.T) {
	for _, ref := range []string{"oci:layout", "oci:/abs/layout:latest", "registry.example.com/app:v1", ""} {
		if rootfs, err := anywhere.Unpack(context.Background(), ref, t.TempDir()); err == nil {
			t.Errorf("Unpack(%q) = %q, want an error", ref, rootfs)
		}
		if _, err := anywhere.Config(context.Background(), ref); err == nil {
			t.Errorf("Config(%q) succeeded, want an error", ref)
		}
	}
}

func TestUnpackCancelled(t *testing.T) {
	pinned, _ := layoutWith(t, imageOf(t, v1.Config{}, layer(t, file("f", "x"))))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := anywhere.Unpack(ctx, pinned, t.TempDir()); !errors.Is(err, context.Canceled) {
		t.Fatalf("Unpack with a cancelled context: %v, want context.Canceled", err)
	}
}
