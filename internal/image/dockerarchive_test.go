package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// dockerSave writes img as go-containerregistry's tarball.Write does: the
// docker save layout (manifest.json, config and gzipped layers), no
// index.json.
func dockerSave(t *testing.T, p, tag string, img v1.Image) {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(p, ref, img); err != nil {
		t.Fatal(err)
	}
}

// legacySave writes a tar as Docker before 25 wrote `docker save`:
// <id>.json config, <layer id>/layer.tar uncompressed layers, the second
// layer a symlink to the first's file (Docker links a layer it repeats).
func legacySave(t *testing.T, p string, cfg v1.Config, layerTar []byte, repoTags ...string) {
	t.Helper()
	cf := v1.ConfigFile{OS: hostPlatform().OS, Architecture: hostPlatform().Architecture, Config: cfg}
	cf.RootFS.Type = "layers"
	diffID, _, err := v1.SHA256(bytes.NewReader(layerTar))
	if err != nil {
		t.Fatal(err)
	}
	cf.RootFS.DiffIDs = []v1.Hash{diffID, diffID}
	rawConfig, err := json.Marshal(cf)
	if err != nil {
		t.Fatal(err)
	}
	configID, _, err := v1.SHA256(bytes.NewReader(rawConfig))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := json.Marshal([]dockerImage{{
		Config:   configID.Hex + ".json",
		RepoTags: repoTags,
		Layers:   []string{"aaa/layer.tar", "bbb/layer.tar"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	archive := tarOf(t,
		file(configID.Hex+".json", string(rawConfig)),
		dir("aaa/"),
		file("aaa/layer.tar", string(layerTar)),
		dir("bbb/"),
		symlink("bbb/layer.tar", "../aaa/layer.tar"),
		file("manifest.json", string(manifest)),
	)
	if err := os.WriteFile(p, archive, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestDockerSaveArchives(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	cfg := v1.Config{Entrypoint: []string{"/app"}, Env: []string{"MODE=saved"}}
	img := imageOf(t, cfg, layer(t, dir("etc/"), file("etc/motd", "hello")))
	dockerSave(t, filepath.Join(base, "tarball.tar"), "registry.local:5000/team/app:v1", img)
	legacySave(t, filepath.Join(base, "legacy.tar"), cfg, tarOf(t, dir("etc/"), file("etc/motd", "hello")), "app:v1", "app:stable")
	legacySave(t, filepath.Join(base, "untagged.tar"), cfg, tarOf(t, file("motd", "hi")))

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(mustReadBytes(t, filepath.Join(base, "tarball.tar")))
	zw.Close()
	if err := os.WriteFile(filepath.Join(base, "saved.tar.gz"), gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, ref string
		// wantErr, when set, is part of Resolve's error.
		wantErr string
	}{
		{name: "go-containerregistry tarball", ref: "oci:tarball.tar"},
		{name: "tarball by tag", ref: "oci:tarball.tar:v1"},
		{name: "docker save with a linked layer", ref: "oci:legacy.tar"},
		{name: "docker save, second tag", ref: "oci:legacy.tar:stable"},
		{name: "docker save without tags", ref: "oci:untagged.tar"},
		{name: "wrong tag", ref: "oci:legacy.tar:v2", wantErr: `no image tagged "v2"`},
		{name: "compressed", ref: "oci:saved.tar.gz", wantErr: "compressed file: decompress it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pinned, err := Resolve(ctx, tc.ref, base)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Resolve(%q) = %q, %v; want an error containing %q", tc.ref, pinned, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tc.ref, err)
			}
			again, err := Resolve(ctx, pinned, "")
			if err != nil || again != pinned {
				t.Fatalf("Resolve(%q) = %q, %v; want the pinned reference itself", pinned, again, err)
			}
			got, err := anywhere.Config(ctx, pinned)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Entrypoint, cfg.Entrypoint) || !slices.Equal(got.Env, cfg.Env) {
				t.Fatalf("Config(%q) = %+v, want %+v", pinned, got, cfg)
			}
			rootfs, err := anywhere.Unpack(ctx, pinned, filepath.Join(base, "cache"))
			if err != nil {
				t.Fatalf("Unpack(%q): %v", pinned, err)
			}
			entries, err := os.ReadDir(rootfs)
			if err != nil || len(entries) == 0 {
				t.Fatalf("Unpack(%q) left %v (%v), want the image's files", pinned, entries, err)
			}
		})
	}
}

// A docker save archive whose layer does not hash to what it did when its
// reference was pinned is refused, as a corrupt OCI layout is.
func TestDockerSaveArchiveChanged(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "saved.tar")
	cfg := v1.Config{Cmd: []string{"/app"}}
	legacySave(t, p, cfg, tarOf(t, file("app", "one")))
	pinned, err := Resolve(ctx, "oci:"+p, "")
	if err != nil {
		t.Fatal(err)
	}
	legacySave(t, p, cfg, tarOf(t, file("app", "two")))
	if _, err := anywhere.Unpack(ctx, pinned, t.TempDir()); err == nil || !strings.Contains(err.Error(), "has no manifest") {
		t.Fatalf("Unpack of a changed archive: %v, want an error saying the pinned manifest is gone", err)
	}
}

func TestCachedConfig(t *testing.T) {
	ctx := context.Background()
	cfg := v1.Config{Entrypoint: []string{"/bin/sh"}, Cmd: []string{"-c", "true"}, User: "app", WorkingDir: "/srv"}
	pinned, dir := layoutWith(t, imageOf(t, cfg, layer(t, file("f", "x"))))
	cache := t.TempDir()
	// A cache entry as an older node left it: a rootfs and no config.
	got, err := anywhere.CachedConfig(ctx, pinned, cache)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Cmd, cfg.Cmd) || got.User != cfg.User || got.WorkingDir != cfg.WorkingDir {
		t.Fatalf("CachedConfig = %+v, want %+v", got, cfg)
	}
	fresh := t.TempDir()
	if _, err := anywhere.Unpack(ctx, pinned, fresh); err != nil {
		t.Fatal(err)
	}
	// With the source gone, only the caches can answer.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{cache, fresh} {
		got, err := anywhere.CachedConfig(ctx, pinned, c)
		if err != nil {
			t.Fatalf("CachedConfig from %s with the image gone: %v", c, err)
		}
		if !slices.Equal(got.Entrypoint, cfg.Entrypoint) {
			t.Fatalf("CachedConfig from %s = %+v, want %+v", c, got, cfg)
		}
	}
}

func mustReadBytes(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
