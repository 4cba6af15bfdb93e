package image

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestBuildFromRootfs: a root filesystem directory, or a tar of it (plain
// or gzipped), becomes an image whose files, modes and symlinks unpack as
// they were and whose config runs as given.
func TestBuildFromRootfs(t *testing.T) {
	ctx := context.Background()
	rootfs := t.TempDir()
	for name, body := range map[string]string{"app/main.py": "print('hi')\n", "etc/app.conf": "k=v\n"} {
		if err := os.MkdirAll(filepath.Join(rootfs, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rootfs, name), []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/app/main.py", filepath.Join(rootfs, "main")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(rootfs, "tmp"), fs.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(rootfs, "tmp"), fs.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	tarFile := filepath.Join(t.TempDir(), "rootfs.tar")
	gzFile := filepath.Join(t.TempDir(), "rootfs.tar.gz")
	for _, args := range [][]string{{"-C", rootfs, "-cf", tarFile, "."}, {"-C", rootfs, "-czf", gzFile, "."}} {
		if out, err := exec.Command("tar", args...).CombinedOutput(); err != nil {
			t.Fatalf("tar %v: %v\n%s", args, err, out)
		}
	}
	config := v1.Config{Entrypoint: []string{"/usr/bin/python3", "/app/main.py"}, Env: []string{"GREETING=hi"}, WorkingDir: "/app"}
	for name, source := range map[string]string{"directory": rootfs, "tar": tarFile, "gzipped tar": gzFile} {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "app")
			digest, err := BuildFromRootfs(ctx, out, RootfsSpec{Source: source, Config: config, Tag: "v1"})
			if err != nil {
				t.Fatalf("BuildFromRootfs: %v", err)
			}
			pinned, err := Resolve(ctx, "oci:app:v1", filepath.Dir(out))
			if err != nil || pinned != "oci:"+out+"@"+digest.String() {
				t.Fatalf("Resolve = %q, %v; want the built digest %s", pinned, err, digest)
			}
			unpacked, err := anywhere.Unpack(ctx, pinned, t.TempDir())
			if err != nil {
				t.Fatalf("Unpack: %v", err)
			}
			if got := mustRead(t, filepath.Join(unpacked, "app/main.py")); got != "print('hi')\n" {
				t.Errorf("app/main.py = %q", got)
			}
			if fi, err := os.Lstat(filepath.Join(unpacked, "etc/app.conf")); err != nil || fi.Mode() != 0o640 {
				t.Errorf("etc/app.conf: %v, %v; want mode 0640", fi, err)
			}
			if fi, err := os.Lstat(filepath.Join(unpacked, "tmp")); err != nil || fi.Mode() != fs.ModeDir|fs.ModeSticky|0o777 {
				t.Errorf("tmp: %v, %v; want a sticky 0777 directory", fi, err)
			}
			if target, err := os.Readlink(filepath.Join(unpacked, "main")); err != nil || target != "/app/main.py" {
				t.Errorf("main -> %q, %v; want /app/main.py", target, err)
			}
			cfg, err := anywhere.Config(ctx, pinned)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.Entrypoint, config.Entrypoint) || !slices.Equal(cfg.Env, config.Env) || cfg.WorkingDir != "/app" {
				t.Errorf("config %+v, want %+v", cfg, config)
			}
		})
	}
}

// TestBuildFromRootfsRefuses: what is no root filesystem, or a layout
// written into the tree it is made from, is refused naming the path.
func TestBuildFromRootfsRefuses(t *testing.T) {
	ctx := context.Background()
	rootfs := t.TempDir()
	junk := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(junk, []byte("not a tar at all, but long enough to be read as a header block? no."), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ source, out, want string }{
		"missing":            {source: "/nonexistent/rootfs", out: filepath.Join(t.TempDir(), "x"), want: "/nonexistent/rootfs"},
		"not a tar":          {source: junk, out: filepath.Join(t.TempDir(), "x"), want: junk + ": want a directory or a tar"},
		"layout in the tree": {source: rootfs, out: filepath.Join(rootfs, "image"), want: "inside the root filesystem"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := BuildFromRootfs(ctx, tc.out, RootfsSpec{Source: tc.source}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
