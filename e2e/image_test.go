package e2e

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// The template sets no command and no env: the image's ENTRYPOINT starts
// the counter and its ENV moves it to port 9090, where the readiness probe
// and the router look. Ignoring either, the golden build fails.
func TestImageConfigRunsWithoutCommand(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite"})
	dir := filepath.Join(t.TempDir(), "layout")
	buildCounterImage(t, dir, v1.Config{
		Entrypoint: []string{"/counter"},
		Env:        []string{"PORT=9090", "DATA_DIR=/data"},
		WorkingDir: "/data",
	})
	pinned, err := image.Resolve(c.ctx, image.LayoutScheme+dir, "")
	if err != nil {
		t.Fatal(err)
	}
	c.applyTemplate(imageTemplate(t, "from-config", pinned, 9090))
	countsAcrossSuspend(t, c, "cfg", "from-config")
}

// A tarball in docker save's layout (manifest.json, config and layers, no
// index.json) is an image source; its CMD is the command.
func TestDockerSaveTarball(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite"})
	dir := filepath.Join(t.TempDir(), "layout")
	digest := buildCounterImage(t, dir, v1.Config{Cmd: []string{"/counter"}, Env: []string{"PORT=8080"}})
	saved := filepath.Join(t.TempDir(), "counter.tar")
	dockerSave(t, dir, digest, saved, "counter:latest")
	pinned, err := image.Resolve(c.ctx, image.LayoutScheme+saved+":latest", "")
	if err != nil {
		t.Fatal(err)
	}
	c.applyTemplate(imageTemplate(t, "from-tarball", pinned, 8080))
	countsAcrossSuspend(t, c, "tar", "from-tarball")
}

// A container without command or args on an image without ENTRYPOINT or
// CMD is refused when the template is applied, not when it is built.
func TestImageWithoutCommandRefused(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite"})
	dir := filepath.Join(t.TempDir(), "layout")
	buildCounterImage(t, dir, v1.Config{Env: []string{"PORT=8080"}, WorkingDir: "/"})
	pinned, err := image.Resolve(c.ctx, image.LayoutScheme+dir, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.templates.CreateTemplate(c.ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: imageTemplate(t, "no-command", pinned, 8080)}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "spec.containers[0].command") {
		t.Fatalf("apply of a template with no command on an image without ENTRYPOINT or CMD: %v, want InvalidArgument naming spec.containers[0].command", err)
	}
	_, err = c.templates.GetTemplate(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "no-command"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("the refused template was stored: GetTemplate = %v", err)
	}
}

// countsAcrossSuspend creates actor on template and checks, through the
// router, that it counts and that a suspend and resume keep its memory.
func countsAcrossSuspend(t *testing.T, c *cluster, actor, template string) {
	t.Helper()
	c.createActor(actor, template)
	for i, want := range []string{"count=1 lines=1", "count=2 lines=2"} {
		if code, _, body := c.routerGet(actor); code != http.StatusOK || body != want {
			t.Fatalf("request %d to %s: %d %q, want %q", i+1, actor, code, body, want)
		}
	}
	c.suspend(actor)
	if code, _, body := c.routerGet(actor); code != http.StatusOK || body != "count=3 lines=3" {
		t.Fatalf("request to %s after a suspend: %d %q, want count=3 lines=3", actor, code, body)
	}
}

// imageTemplate runs pinned with nothing but what its config says, ready
// when it answers on port.
func imageTemplate(t *testing.T, name, pinned string, port int32) *torporv1.Template {
	return counterTemplate(t, name, func(s *torporv1.TemplateSpec) {
		ctr := s.Containers[0]
		ctr.Image, ctr.Command, ctr.Env = pinned, nil, nil
		ctr.ReadinessProbe.HttpGet.Port = port
	})
}

// buildCounterImage writes an OCI layout at dir holding the counter
// example's binary (taken from its image) with config cfg, and returns the
// image's digest.
func buildCounterImage(t *testing.T, dir string, cfg v1.Config) v1.Hash {
	t.Helper()
	ctx := context.Background()
	rootfs, err := runtimetest.ImagePolicy(t).Unpack(ctx, runtimetest.CounterImage(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	digest, err := image.BuildLayout(ctx, dir, image.LayoutSpec{
		Files:  map[string]string{"/counter": filepath.Join(rootfs, "counter")},
		Dirs:   map[string]fs.FileMode{"/data": 0o755, "/tmp": fs.ModeSticky | 0o777},
		Config: cfg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return digest
}

// dockerSave writes the image digest of the layout at dir to dst as
// `docker save` does, and checks that it is not an OCI layout too.
func dockerSave(t *testing.T, dir string, digest v1.Hash, dst, tag string) {
	t.Helper()
	p, err := ocilayout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	img, err := p.Image(digest)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(dst, ref, img); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[hdr.Name] = true
	}
	if !names["manifest.json"] || names["index.json"] {
		t.Fatalf("%s holds %v, want docker save's manifest.json and no OCI index.json", dst, names)
	}
}
