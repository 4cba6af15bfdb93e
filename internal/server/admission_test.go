package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
)

// pushImage puts an empty image with config cfg into the registry at host
// and returns its pinned reference.
func pushImage(t *testing.T, host, repo string, cfg v1.Config) string {
	t.Helper()
	img, err := mutate.Config(empty.Image, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host + "/" + repo + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return ref.Context().Name() + "@" + digest.String()
}

// watchOpens reports every open or read of a file in dir from now on.
func watchOpens(t *testing.T, dir string) (opened func() bool) {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_OPEN|unix.IN_ACCESS); err != nil {
		t.Fatal(err)
	}
	return func() bool {
		buf := make([]byte, 4096)
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
}

// TestApplyEnforcesTheImagePolicy: a template naming an image the
// installation does not allow is refused at apply, naming the field and the
// rule, and the server neither dials nor opens it; an allowed registry is
// read (here for the command check).
func TestApplyEnforcesTheImagePolicy(t *testing.T) {
	ctx := context.Background()
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	var dialed atomic.Int32
	go func() {
		for {
			c, err := probe.Accept()
			if err != nil {
				return
			}
			dialed.Add(1)
			c.Close()
		}
	}()

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	regHost := strings.TrimPrefix(reg.URL, "http://")
	withEntrypoint := pushImage(t, regHost, "team/app", v1.Config{Entrypoint: []string{"/app"}})
	bare := pushImage(t, regHost, "team/bare", v1.Config{Env: []string{"A=1"}})

	// A valid image, in a directory the policy does not name.
	outside := t.TempDir()
	digest, err := image.BuildLayout(ctx, outside, image.LayoutSpec{Dirs: map[string]fs.FileMode{"/x": 0o755}, Config: v1.Config{Entrypoint: []string{"/x"}}})
	if err != nil {
		t.Fatal(err)
	}
	opened := watchOpens(t, outside)

	images, err := image.NewPolicy(image.PolicyConfig{Registries: []string{regHost}, Dirs: []string{"/images"}})
	if err != nil {
		t.Fatal(err)
	}
	r := startReplicaWith(t, "sqlite:"+filepath.Join(t.TempDir(), "t.db"), Options{Logger: slog.New(slog.DiscardHandler), Images: images})
	c := r.clients(r.admin(t))
	hex64 := strings.Repeat("ab", 32)
	tests := []struct {
		name  string
		image string
		want  string // "" when applied
		field string
	}{
		{"loopback registry", probe.Addr().String() + "/probe/x@sha256:" + hex64,
			"registry " + probe.Addr().String() + " is not allowed", "spec.containers[0].image"},
		{"host file", "oci:/etc/shadow@sha256:" + hex64, "local image /etc/shadow is outside the allowed image directories", "spec.containers[0].image"},
		{"image outside the allowed directories", "oci:" + outside + "@" + digest.String(), "is outside the allowed image directories", "spec.containers[0].image"},
		{"allowed registry", withEntrypoint, "", ""},
		{"allowed registry, image read", bare, "has no ENTRYPOINT or CMD", "spec.containers[0].command"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := counterTemplate(fmt.Sprintf("t%d", i))
			tmpl.Spec.Containers[0].Image = tc.image
			_, err := c.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tmpl}))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("apply: %v", err)
				}
				return
			}
			wantCode(t, err, connect.CodeInvalidArgument, tc.field+": ")
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("apply: %v, want the rule %q", err, tc.want)
			}
		})
	}
	if n := dialed.Load(); n != 0 {
		t.Errorf("the refused registry's address was dialed %d times", n)
	}
	if opened() {
		t.Errorf("the server opened a file of the refused image in %s", outside)
	}
}

// TestApplyValidatesAtTheDoor: what the installation cannot run, or what
// would break an actor later, is refused at apply naming the field.
func TestApplyValidatesAtTheDoor(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, "sqlite:"+filepath.Join(t.TempDir(), "t.db"), io.Discard)
	c := r.clients(r.admin(t))
	bomb := make([]*torporv1.EnvVar, 25_000)
	for i := range bomb {
		bomb[i] = &torporv1.EnvVar{Name: fmt.Sprintf("BOMB_%d", i), Value: strings.Repeat("x", 100)}
	}
	tests := []struct {
		name   string
		change func(*torporv1.TemplateSpec)
		field  string
		reason string
	}{
		{"unknown sandbox class", func(s *torporv1.TemplateSpec) { s.SandboxClass = "kata" }, "spec.sandboxClass", `"kata" is not a sandbox class of this installation (offered: gvisor)`},
		{"onCommit 99", func(s *torporv1.TemplateSpec) { s.SnapshotPolicy = &torporv1.SnapshotPolicy{OnCommit: 99} }, "spec.snapshotPolicy.onCommit", "want FULL or DATA"},
		{"onPause 99", func(s *torporv1.TemplateSpec) { s.SnapshotPolicy = &torporv1.SnapshotPolicy{OnPause: 99} }, "spec.snapshotPolicy.onPause", "want FULL or DATA"},
		{"fromData 99", func(s *torporv1.TemplateSpec) {
			s.SnapshotPolicy = &torporv1.SnapshotPolicy{OnResume: &torporv1.OnResume{FromData: 99}}
		}, "spec.snapshotPolicy.onResume.fromData", "want COLD_BOOT or GOLDEN"},
		{"idle action 99", func(s *torporv1.TemplateSpec) { s.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 30, Action: 99} }, "spec.idlePolicy.action", "want PAUSE or SUSPEND"},
		{"volume kind 99", func(s *torporv1.TemplateSpec) { s.Volumes[0].Kind = 99 }, "spec.volumes[0].kind", "want DURABLE"},
		{"env bomb", func(s *torporv1.TemplateSpec) { s.Containers[0].Env = bomb }, "spec.containers[0].env", "25000 variables, more than 256"},
		{"env name with =", func(s *torporv1.TemplateSpec) { s.Containers[0].Env = []*torporv1.EnvVar{{Name: "A=B", Value: "c"}} }, "spec.containers[0].env[0].name", "no '='"},
		{"mount over the identity", func(s *torporv1.TemplateSpec) { s.Containers[0].Mounts[0].Path = "/run/torpor/identity" }, "spec.containers[0].mounts[0].path", "would hide /run/torpor"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := counterTemplate("counter")
			tc.change(tmpl.Spec)
			_, err := c.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tmpl}))
			wantCode(t, err, connect.CodeInvalidArgument, tc.field+": ")
			if !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("apply: %v, want %q", err, tc.reason)
			}
		})
	}
	list, err := c.templates.ListTemplates(ctx, connect.NewRequest(&torporv1.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.Msg.GetTemplates()); n != 0 {
		t.Fatalf("refused templates were stored: %d", n)
	}

	// A class a registered node offers is one the installation offers.
	if _, err := r.store.Nodes().Create(ctx, &torporv1.Node{Metadata: &torporv1.ObjectMeta{Name: "n1"}, SandboxClasses: []string{"gvisor", "kata"}}); err != nil {
		t.Fatal(err)
	}
	tmpl := counterTemplate("counter")
	tmpl.Spec.SandboxClass = "kata"
	if _, err := c.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tmpl})); err != nil {
		t.Fatalf("apply of a class a node offers: %v", err)
	}
}
