package image

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// otherPlatform is a platform that is never this machine's.
func otherPlatform() v1.Platform {
	if hostPlatform().Architecture == "s390x" {
		return v1.Platform{OS: "linux", Architecture: "riscv64"}
	}
	return v1.Platform{OS: "linux", Architecture: "s390x"}
}

func multiPlatform(t *testing.T, host, other v1.Image) v1.ImageIndex {
	t.Helper()
	hp, op := hostPlatform(), otherPlatform()
	return mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &op}},
		mutate.IndexAddendum{Add: host, Descriptor: v1.Descriptor{Platform: &hp}},
	)
}

func TestResolveLayout(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	imgA := imageOf(t, v1.Config{Cmd: []string{"a"}}, layer(t, file("a", "A")))
	imgB := imageOf(t, v1.Config{Cmd: []string{"b"}}, layer(t, file("b", "B")))
	idx := multiPlatform(t, imgA, imgB)
	a, b, idxDigest := digestOf(t, imgA), digestOf(t, imgB), digestOf(t, idx)

	writeLayout(t, filepath.Join(base, "single"), tagged{tag: "v1", img: imgA})
	writeLayout(t, filepath.Join(base, "multi"), tagged{tag: "a", img: imgA}, tagged{tag: "b", img: imgB})
	writeLayout(t, filepath.Join(base, "platforms"), tagged{tag: "all", idx: idx})
	if err := os.Mkdir(filepath.Join(base, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	tarDir(t, filepath.Join(base, "single"), filepath.Join(base, "single.tar"))
	tarDir(t, filepath.Join(base, "multi"), filepath.Join(base, "multi.tar"))
	if err := os.WriteFile(filepath.Join(base, "notes.txt"), []byte("not a tar"), 0o644); err != nil {
		t.Fatal(err)
	}
	pinned := func(p string, d v1.Hash) string { return "oci:" + filepath.Join(base, p) + "@" + d.String() }

	tests := []struct {
		name    string
		ref     string
		baseDir string
		want    string
		wantErr string
	}{
		{name: "relative untagged", ref: "oci:single", baseDir: base, want: pinned("single", a)},
		{name: "relative dot tagged", ref: "oci:./single:v1", baseDir: base, want: pinned("single", a)},
		{name: "absolute ignores base", ref: "oci:" + base + "/single", baseDir: "/nonexistent", want: pinned("single", a)},
		{name: "by digest", ref: "oci:single@" + a.String(), baseDir: base, want: pinned("single", a)},
		{name: "tagged among several", ref: "oci:multi:b", baseDir: base, want: pinned("multi", b)},
		{name: "tar untagged", ref: "oci:single.tar", baseDir: base, want: pinned("single.tar", a)},
		{name: "tar tagged", ref: "oci:multi.tar:b", baseDir: base, want: pinned("multi.tar", b)},
		{name: "index picks host platform", ref: "oci:platforms:all", baseDir: base, want: pinned("platforms", a)},
		{name: "index by digest", ref: "oci:platforms@" + idxDigest.String(), baseDir: base, want: pinned("platforms", a)},
		{name: "image inside index by digest", ref: "oci:platforms@" + b.String(), baseDir: base, want: pinned("platforms", b)},
		{name: "several untagged", ref: "oci:multi", baseDir: base, wantErr: "name one by tag (tags: a, b)"},
		{name: "bad tag", ref: "oci:single:v2", baseDir: base, wantErr: `no image tagged "v2" (tags: v1)`},
		{name: "bad tag in tar", ref: "oci:multi.tar:c", baseDir: base, wantErr: `no image tagged "c"`},
		{name: "missing dir", ref: "oci:missing", baseDir: base, wantErr: "no such file or directory"},
		{name: "digest not in layout", ref: "oci:single@" + b.String(), baseDir: base, wantErr: "has no manifest " + b.String()},
		{name: "not a layout", ref: "oci:empty", baseDir: base, wantErr: "is not an OCI image layout"},
		{name: "not a tar", ref: "oci:notes.txt", baseDir: base, wantErr: "neither a directory nor a tar"},
		{name: "relative without base", ref: "oci:single", wantErr: "no base directory"},
		{name: "bad digest", ref: "oci:single@sha256:abc", baseDir: base, wantErr: "bad digest"},
		{name: "empty path", ref: "oci::v1", baseDir: base, wantErr: "empty layout path"},
		{name: "empty ref", ref: "", wantErr: "empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resolve(ctx, tc.ref, tc.baseDir)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("Resolve(%q) = %q, want error containing %q", tc.ref, got, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), tc.ref) {
					t.Fatalf("Resolve(%q) error %q, want it to name the ref and contain %q", tc.ref, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tc.ref, err)
			}
			if got != tc.want {
				t.Fatalf("Resolve(%q) = %q, want %q", tc.ref, got, tc.want)
			}
			if !IsPinned(got) {
				t.Fatalf("IsPinned(%q) = false for a resolved ref", got)
			}
		})
	}
}

func TestResolveRegistry(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")

	imgA := imageOf(t, v1.Config{Entrypoint: []string{"/a"}}, layer(t, dir("bin/"), file("bin/a", "A")))
	imgB := imageOf(t, v1.Config{Entrypoint: []string{"/b"}}, layer(t, file("b", "B")))
	a := digestOf(t, imgA)
	push := func(ref string, img v1.Image) {
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
			t.Fatalf("push %s: %v", ref, err)
		}
	}
	push(host+"/team/app:v1", imgA)
	idxRef, err := name.ParseReference(host + "/team/multi:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(idxRef, multiPlatform(t, imgA, imgB), remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		ref     string
		want    string
		wantErr string
	}{
		{name: "tag", ref: host + "/team/app:v1", want: host + "/team/app@" + a.String()},
		{name: "digest", ref: host + "/team/app@" + a.String(), want: host + "/team/app@" + a.String()},
		{name: "index picks host platform", ref: host + "/team/multi:v1", want: host + "/team/multi@" + a.String()},
		{name: "missing tag", ref: host + "/team/app:v2", wantErr: "MANIFEST_UNKNOWN"},
		{name: "missing repo", ref: host + "/team/none:v1", wantErr: "NAME_UNKNOWN"},
		{name: "invalid", ref: host + "/Team/App:v1", wantErr: "could not parse reference"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resolve(ctx, tc.ref, "")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), tc.ref) {
					t.Fatalf("Resolve(%q) = %q, %v; want an error naming the ref and containing %q", tc.ref, got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tc.ref, err)
			}
			if got != tc.want {
				t.Fatalf("Resolve(%q) = %q, want %q", tc.ref, got, tc.want)
			}
		})
	}

	pinned := host + "/team/app@" + a.String()
	// A loopback registry is read only when allowed by its exact name.
	allowed, err := NewPolicy(PolicyConfig{Registries: []string{host}})
	if err != nil {
		t.Fatal(err)
	}
	rootfs, err := allowed.Unpack(ctx, pinned, t.TempDir())
	if err != nil {
		t.Fatalf("Unpack(%q): %v", pinned, err)
	}
	if got := mustRead(t, filepath.Join(rootfs, "bin/a")); got != "A" {
		t.Fatalf("bin/a = %q, want %q", got, "A")
	}
	cfg, err := allowed.Config(ctx, pinned)
	if err != nil {
		t.Fatalf("Config(%q): %v", pinned, err)
	}
	if len(cfg.Entrypoint) != 1 || cfg.Entrypoint[0] != "/a" {
		t.Fatalf("Config(%q).Entrypoint = %q, want [/a]", pinned, cfg.Entrypoint)
	}
}

func TestIsPinned(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	tests := []struct {
		ref  string
		want bool
	}{
		{"oci:/srv/images/app@sha256:" + hex, true},
		{"oci:/srv/images/app.tar@sha256:" + hex, true},
		{"registry.example.com/team/app@sha256:" + hex, true},
		{"registry.example.com:5000/team/app@sha256:" + hex, true},
		{"oci:images/app@sha256:" + hex, false}, // relative: meaningless elsewhere
		{"oci:/srv/images/app:latest", false},
		{"oci:/srv/images/app", false},
		{"oci:/srv/images/app@sha256:" + hex[:63], false},
		{"oci:/srv/images/app@sha512:" + hex + hex, false},
		{"registry.example.com/team/app:latest", false},
		{"registry.example.com/team/app", false},
		{"registry.example.com/team/app@sha256:" + strings.ToUpper(hex), false},
		{"", false},
	}
	for _, tc := range tests {
		if got := IsPinned(tc.ref); got != tc.want {
			t.Errorf("IsPinned(%q) = %v, want %v", tc.ref, got, tc.want)
		}
	}
}
