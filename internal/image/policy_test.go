package image

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func newPolicy(t *testing.T, c PolicyConfig) *Policy {
	t.Helper()
	p, err := NewPolicy(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyCheck(t *testing.T) {
	digest := "@sha256:" + strings.Repeat("ab", 32)
	allowed := t.TempDir()
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(allowed, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(outside, "img"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := newPolicy(t, PolicyConfig{
		Registries: []string{"registry.example.com", "127.0.0.1:5000", "*.corp.example", "docker.io"},
		Dirs:       []string{allowed},
	})
	anyPublic := newPolicy(t, PolicyConfig{Registries: []string{"*"}})
	tests := []struct {
		name   string
		policy *Policy
		ref    string
		rule   string // "" when allowed
	}{
		{"exact host", p, "registry.example.com/team/app" + digest, ""},
		{"exact host, any port", p, "registry.example.com:8443/team/app" + digest, ""},
		{"host not listed", p, "evil.example.net/app" + digest, "registry evil.example.net is not allowed (allowed: "},
		{"loopback named with its port", p, "127.0.0.1:5000/app" + digest, ""},
		{"loopback on another port", p, "127.0.0.1:27095/probe/x" + digest, "registry 127.0.0.1:27095 is not allowed"},
		{"below a domain", p, "eu.corp.example/app" + digest, ""},
		{"the domain itself is not below it", p, "corp.example/app" + digest, "registry corp.example is not allowed"},
		{"Docker Hub by its short name", p, "library/busybox" + digest, ""},
		{"any public host", anyPublic, "ghcr.io/app" + digest, ""},
		{"* is not loopback", anyPublic, "127.0.0.1:27095/probe/x" + digest, "127.0.0.1:27095 is a loopback address: allowed only when named exactly"},
		{"* is not localhost", anyPublic, "localhost:5000/app" + digest, "a loopback address"},
		{"* is not metadata", anyPublic, "169.254.169.254/app" + digest, "a link-local address"},
		{"* is not private", anyPublic, "10.1.2.3:5000/app" + digest, "a private address"},
		{"* is not IPv6 loopback", anyPublic, "[::1]:5000/app" + digest, "a loopback address"},
		{"no registry allowed", newPolicy(t, PolicyConfig{Dirs: []string{allowed}}), "registry.example.com/app" + digest, "allows no registry"},
		{"nil policy", nil, "registry.example.com/app" + digest, "allows no registry"},
		{"local inside", p, "oci:" + filepath.Join(allowed, "img") + digest, ""},
		{"local inside, missing", p, "oci:" + filepath.Join(allowed, "gone") + digest, ""},
		{"the directory itself", p, "oci:" + allowed + digest, ""},
		{"host file", p, "oci:/etc/shadow" + digest, "local image /etc/shadow is outside the allowed image directories"},
		{"dot-dot out", p, "oci:" + allowed + "/../../../etc/shadow" + digest, "local image /etc/shadow is outside"},
		{"prefix is not a parent", p, "oci:" + allowed + "-other/img" + digest, "is outside the allowed image directories"},
		{"symlink out", p, "oci:" + filepath.Join(allowed, "escape", "img") + digest, "is outside the allowed image directories"},
		{"no directory allowed", anyPublic, "oci:" + filepath.Join(allowed, "img") + digest, "allows no image directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.policy.Check(tc.ref)
			if tc.rule == "" {
				if err != nil {
					t.Fatalf("Check(%q) = %v, want allowed", tc.ref, err)
				}
				return
			}
			var refused *RefusedError
			if !errors.As(err, &refused) || !strings.Contains(err.Error(), tc.rule) {
				t.Fatalf("Check(%q) = %v, want refused: %q", tc.ref, err, tc.rule)
			}
		})
	}
}

func TestNewPolicyRefusesBadConfig(t *testing.T) {
	for _, c := range []PolicyConfig{
		{Registries: []string{"https://registry.example.com"}},
		{Registries: []string{"registry.example.com/team"}},
		{Registries: []string{"reg*.example.com"}},
		{Registries: []string{"registry.example.com:99999"}},
		{Dirs: []string{"relative/images"}},
		{Registries: []string{"registry.example.com"}, Auth: map[string]authn.AuthConfig{"other.example.com": {Username: "u", Password: "p"}}},
	} {
		if _, err := NewPolicy(c); err == nil {
			t.Errorf("NewPolicy(%+v) succeeded, want an error", c)
		}
	}
}

// listener counts the connections made to a loopback address that no
// allowed reference may reach.
func listener(t *testing.T, network string) (addr string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen(network, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), accepted
}

func TestPolicyRefusesBeforeOpeningOrDialing(t *testing.T) {
	ctx := context.Background()
	addr, accepted := listener(t, "tcp")
	digest := "@sha256:" + strings.Repeat("ab", 32)
	p := newPolicy(t, PolicyConfig{Registries: []string{"*"}, Dirs: []string{t.TempDir()}})
	for _, ref := range []string{addr + "/probe/x" + digest, "oci:/etc/shadow" + digest} {
		if _, err := p.Unpack(ctx, ref, t.TempDir()); !errors.As(err, new(*RefusedError)) {
			t.Errorf("Unpack(%q) = %v, want refused", ref, err)
		}
		if _, err := p.Config(ctx, ref); !errors.As(err, new(*RefusedError)) {
			t.Errorf("Config(%q) = %v, want refused", ref, err)
		}
		if _, err := p.CachedConfig(ctx, ref, t.TempDir()); !errors.As(err, new(*RefusedError)) {
			t.Errorf("CachedConfig(%q) = %v, want refused", ref, err)
		}
	}
	// A name the patterns allow is dialed only at a public address, whatever
	// it resolves to ("localhost" passes the patterns here only because the
	// dial is called directly).
	_, port, _ := net.SplitHostPort(addr)
	if conn, err := p.dial(ctx, "tcp", "localhost:"+port); err == nil {
		conn.Close()
		t.Errorf("dial localhost:%s through *: connected, want refused", port)
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the loopback listener accepted %d connections, want none", n)
	}
}

// testRegistry serves an in-process registry holding one image, wrapped by
// wrap, and returns its host and the image's pinned reference there.
func testRegistry(t *testing.T, wrap func(http.Handler) http.Handler) (host, pinned string) {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(wrap(reg))
	t.Cleanup(srv.Close)
	host = strings.TrimPrefix(srv.URL, "http://")
	img := imageOf(t, v1.Config{Entrypoint: []string{"/a"}}, layer(t, file("a", "A")))
	ref, err := name.ParseReference(host + "/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	// Pushed straight to the registry, past the wrapper.
	direct := httptest.NewServer(reg)
	defer direct.Close()
	directRef, err := name.ParseReference(strings.TrimPrefix(direct.URL, "http://") + "/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(directRef, img, remote.WithContext(context.Background())); err != nil {
		t.Fatal(err)
	}
	return host, ref.Context().Name() + "@" + digestOf(t, img).String()
}

func TestPolicyRegistryRedirectToLoopbackIsNotDialed(t *testing.T) {
	ctx := context.Background()
	addr, accepted := listener(t, "tcp")
	_, port, _ := net.SplitHostPort(addr)
	// The allowed registry sends manifests to the node's own port.
	host, pinned := testRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/manifests/") {
				http.Redirect(w, r, "http://localhost:"+port+r.URL.Path, http.StatusTemporaryRedirect)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	p := newPolicy(t, PolicyConfig{Registries: []string{host}})
	if _, err := p.Config(ctx, pinned); err == nil || !strings.Contains(err.Error(), "a loopback address") {
		t.Fatalf("Config through a redirect to localhost = %v, want the dial refused", err)
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the redirect target accepted %d connections, want none", n)
	}
}

func TestPolicyCredentials(t *testing.T) {
	ctx := context.Background()
	host, pinned := testRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, pw, ok := r.BasicAuth(); !ok || u != "robot" || pw != "s3cret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	// The Docker config of whoever runs the process holds the right
	// credentials; a policy must not take them.
	dockerConfig := t.TempDir()
	if err := os.WriteFile(filepath.Join(dockerConfig, "config.json"),
		[]byte(`{"auths":{"`+host+`":{"username":"robot","password":"s3cret"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dockerConfig)
	if _, err := newPolicy(t, PolicyConfig{Registries: []string{host}}).Config(ctx, pinned); err == nil {
		t.Fatal("Config without configured credentials succeeded: the Docker config was used")
	}

	file := filepath.Join(t.TempDir(), "registries.yaml")
	if err := os.WriteFile(file, []byte(host+":\n  username: robot\n  password: s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := LoadRegistryAuth(file)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := newPolicy(t, PolicyConfig{Registries: []string{host}, Auth: auth}).Config(ctx, pinned)
	if err != nil {
		t.Fatalf("Config with the registry's credentials: %v", err)
	}
	if len(cfg.Entrypoint) != 1 || cfg.Entrypoint[0] != "/a" {
		t.Fatalf("Config = %+v, want the image's entrypoint /a", cfg)
	}
}

func TestLoadRegistryAuth(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "registry.example.com:\n  username: u\n  password: p\nghcr.io:\n  token: t\n", 0o600)
	auth, err := LoadRegistryAuth(good)
	if err != nil {
		t.Fatal(err)
	}
	if auth["registry.example.com"].Username != "u" || auth["ghcr.io"].RegistryToken != "t" {
		t.Fatalf("LoadRegistryAuth = %+v", auth)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"readable.yaml", "registry.example.com:\n  token: t\n", "lets others read it"},
		{"unknown.yaml", "registry.example.com:\n  user: u\n", "unknown field"},
		{"both.yaml", "registry.example.com:\n  username: u\n  password: p\n  token: t\n", "want username and password, or token"},
		{"half.yaml", "registry.example.com:\n  username: u\n", "want username and password, or token"},
	} {
		mode := os.FileMode(0o600)
		if tc.name == "readable.yaml" {
			mode = 0o644
		}
		if _, err := LoadRegistryAuth(write(tc.name, tc.body, mode)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadRegistryAuth(%s) = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
