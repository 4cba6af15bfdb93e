package image

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func TestBuildLayoutRoundTrip(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	tool := filepath.Join(src, "tool")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(src, "conf")
	if err := os.WriteFile(conf, []byte("key=value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := LayoutSpec{
		Files: map[string]string{"/usr/bin/tool": tool, "/etc/tool.conf": conf},
		Dirs:  map[string]fs.FileMode{"/tmp": fs.ModeSticky | 0o777, "/data": 0o750},
		Config: v1.Config{
			Entrypoint: []string{"/usr/bin/tool"},
			Env:        []string{"PORT=8080"},
			WorkingDir: "/data",
		},
		Tag: "v1",
	}
	out := filepath.Join(t.TempDir(), "app")
	digest, err := BuildLayout(ctx, out, spec)
	if err != nil {
		t.Fatalf("BuildLayout: %v", err)
	}
	// Rebuilding over the old layout gives the same image.
	again, err := BuildLayout(ctx, out, spec)
	if err != nil {
		t.Fatalf("second BuildLayout: %v", err)
	}
	if again != digest {
		t.Fatalf("rebuild digest %s, want %s: the build is not reproducible", again, digest)
	}

	pinned, err := Resolve(ctx, "oci:app:v1", filepath.Dir(out))
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if want := "oci:" + out + "@" + digest.String(); pinned != want {
		t.Fatalf("Resolve = %q, want %q", pinned, want)
	}
	rootfs, err := anywhere.Unpack(ctx, pinned, t.TempDir())
	if err != nil {
		t.Fatalf("Unpack: %v", err)
	}
	tests := []struct {
		path string
		mode fs.FileMode
		body string
	}{
		{path: "usr/bin/tool", mode: 0o755, body: "#!/bin/sh\necho hi\n"},
		{path: "etc/tool.conf", mode: 0o600, body: "key=value\n"},
		{path: "usr", mode: fs.ModeDir | 0o755},
		{path: "usr/bin", mode: fs.ModeDir | 0o755},
		{path: "etc", mode: fs.ModeDir | 0o755},
		{path: "tmp", mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{path: "data", mode: fs.ModeDir | 0o750},
	}
	for _, tc := range tests {
		p := filepath.Join(rootfs, tc.path)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Errorf("%s: %v", tc.path, err)
			continue
		}
		if fi.Mode() != tc.mode {
			t.Errorf("%s mode = %v, want %v", tc.path, fi.Mode(), tc.mode)
		}
		if !fi.IsDir() {
			if got := mustRead(t, p); got != tc.body {
				t.Errorf("%s = %q, want %q", tc.path, got, tc.body)
			}
		}
	}
	cfg, err := anywhere.Config(ctx, pinned)
	if err != nil {
		t.Fatalf("Config: %v", err)
	}
	if !slices.Equal(cfg.Entrypoint, spec.Config.Entrypoint) || !slices.Equal(cfg.Env, spec.Config.Env) || cfg.WorkingDir != "/data" {
		t.Fatalf("Config = %+v, want %+v", cfg, spec.Config)
	}
}

func TestBuildLayoutRejectsBadSpecs(t *testing.T) {
	src := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(src, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		spec    LayoutSpec
		wantErr string
	}{
		{name: "relative file", spec: LayoutSpec{Files: map[string]string{"bin": src}}, wantErr: `file "bin": want a clean absolute path`},
		{name: "unclean file", spec: LayoutSpec{Files: map[string]string{"/a/../bin": src}}, wantErr: `file "/a/../bin"`},
		{name: "root dir", spec: LayoutSpec{Dirs: map[string]fs.FileMode{"/": 0o755}}, wantErr: `directory "/"`},
		{name: "missing host file", spec: LayoutSpec{Files: map[string]string{"/bin": src + ".missing"}}, wantErr: "no such file"},
		{name: "host directory", spec: LayoutSpec{Files: map[string]string{"/bin": filepath.Dir(src)}}, wantErr: "not a regular file"},
		{name: "file and dir", spec: LayoutSpec{Files: map[string]string{"/x": src}, Dirs: map[string]fs.FileMode{"/x": 0o755}}, wantErr: "also listed as a directory"},
		{name: "file as parent", spec: LayoutSpec{Files: map[string]string{"/x": src, "/x/y": src}}, wantErr: `file "/x": also the parent directory`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "layout")
			_, err := BuildLayout(context.Background(), out, tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("BuildLayout error = %v, want one containing %q", err, tc.wantErr)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatalf("a failed build left a layout at %s", out)
			}
		})
	}
}
