package main

import (
	"context"
	"crypto/x509"
	"debug/elf"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// buildCounter compiles the counter as the image build does: static.
func buildCounter(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "counter")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startCounter runs the counter binary with a random port, dataDir as its
// volume and env added to its environment, waits until it is ready and
// returns its base URL and a func that stops it.
func startCounter(t *testing.T, bin, dataDir string, env ...string) (string, func()) {
	t.Helper()
	port := freePort(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port), "DATA_DIR="+dataDir)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		cmd.Process.Kill()
		<-exited
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("counter exited before it was ready: %v", err)
		default:
		}
		if code, body := get(t, base+"/readyz"); code == http.StatusOK {
			if body != "ready\n" {
				stop()
				t.Fatalf("/readyz = %q, want %q", body, "ready\n")
			}
			return base, stop
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatal("counter did not become ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get returns the status and body of a GET, or 0 if nothing answered.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

func TestCounterCountsInMemoryAndOnDisk(t *testing.T) {
	bin := buildCounter(t)
	dataDir := filepath.Join(t.TempDir(), "data") // created by the counter
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		restart  bool // stop the process and start a new one on the same volume
		path     string
		wantCode int
		want     string
	}{
		{path: "/", wantCode: 200, want: "count=1 lines=1\n"},
		{path: "/", wantCode: 200, want: "count=2 lines=2\n"},
		{path: "/readyz", wantCode: 200, want: "ready\n"},
		{path: "/hostname", wantCode: 200, want: hostname + "\n"},
		{path: "/elsewhere", wantCode: 404},
		{path: "/", wantCode: 200, want: "count=3 lines=3\n"},
		// Memory is gone after a restart; the volume is not.
		{restart: true, path: "/", wantCode: 200, want: "count=1 lines=4\n"},
		{path: "/", wantCode: 200, want: "count=2 lines=5\n"},
	}
	base, stop := startCounter(t, bin, dataDir)
	defer func() { stop() }()
	for i, s := range steps {
		if s.restart {
			stop()
			base, stop = startCounter(t, bin, dataDir)
		}
		code, body := get(t, base+s.path)
		if code != s.wantCode || (s.want != "" && body != s.want) {
			t.Fatalf("step %d: GET %s = %d %q, want %d %q", i, s.path, code, body, s.wantCode, s.want)
		}
	}
	log, err := os.ReadFile(filepath.Join(dataDir, "requests.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "\n"); n != 5 {
		t.Fatalf("requests.log has %d lines, want 5:\n%s", n, log)
	}
}

// TestMakeImages builds the example image the way CI does and checks that
// the layout resolves, unpacks, and holds a counter that runs.
func TestMakeImages(t *testing.T) {
	ctx := context.Background()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "make", "-C", root, "images")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make images: %v\n%s", err, out)
	}
	pinned, err := image.Resolve(ctx, "oci:image", ".")
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if want := "oci:" + filepath.Join(root, "examples/counter/image") + "@sha256:"; !strings.HasPrefix(pinned, want) || !image.IsPinned(pinned) {
		t.Fatalf("Resolve = %q, want a pinned ref starting %q", pinned, want)
	}
	tagged, err := image.Resolve(ctx, "oci:image:latest", ".")
	if err != nil || tagged != pinned {
		t.Fatalf("Resolve(oci:image:latest) = %q, %v; want %q", tagged, err, pinned)
	}
	images, err := image.NewPolicy(image.PolicyConfig{Dirs: []string{filepath.Join(root, "examples/counter")}})
	if err != nil {
		t.Fatal(err)
	}
	rootfs, err := images.Unpack(ctx, pinned, t.TempDir())
	if err != nil {
		t.Fatalf("Unpack: %v", err)
	}
	fi, err := os.Stat(filepath.Join(rootfs, "counter"))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		t.Fatalf("/counter = %v, %v; want an executable file", fi, err)
	}
	exe, err := elf.Open(filepath.Join(rootfs, "counter"))
	if err != nil {
		t.Fatalf("/counter: %v", err)
	}
	defer exe.Close()
	for _, prog := range exe.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Fatal("/counter is dynamically linked; the image has no libc")
		}
	}
	for _, d := range []string{"data", "tmp", "etc"} {
		if fi, err := os.Stat(filepath.Join(rootfs, d)); err != nil || !fi.IsDir() {
			t.Errorf("/%s = %v, %v; want a directory", d, fi, err)
		}
	}
	cfg, err := images.Config(ctx, pinned)
	if err != nil {
		t.Fatalf("Config: %v", err)
	}
	if !slices.Equal(cfg.Entrypoint, []string{"/counter"}) {
		t.Fatalf("entrypoint = %q, want [/counter]", cfg.Entrypoint)
	}
	base, stop := startCounter(t, filepath.Join(rootfs, "counter"), t.TempDir())
	defer stop()
	if code, body := get(t, base+"/"); code != 200 || body != "count=1 lines=1\n" {
		t.Fatalf("GET / on the image's counter = %d %q", code, body)
	}
}

func TestWhoamiAnswersTheCertificateOnDisk(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, storetest.URL(t, "sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ca, err := identity.Load(ctx, st, identity.Config{})
	if err != nil {
		t.Fatal(err)
	}
	issue := func(actor string) *x509.Certificate {
		_, csr, err := identity.NewCSR()
		if err != nil {
			t.Fatal(err)
		}
		issued, err := ca.IssueWorkloadCertificate(identity.Workload{Space: "default", Actor: actor, ActorUID: "uid-" + actor}, csr)
		if err != nil {
			t.Fatal(err)
		}
		return issued.Certificate
	}
	first, renewed, other := issue("c1"), issue("c1"), issue("c2")
	certPEM := func(c *x509.Certificate) []byte {
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	identityDir := t.TempDir()
	base, stop := startCounter(t, buildCounter(t), t.TempDir(), "IDENTITY_DIR="+identityDir)
	defer stop()
	steps := []struct {
		name     string
		cert     []byte // written to cert.pem before the request; nil: none
		wantCode int
		want     string
	}{
		{"no identity yet", nil, http.StatusServiceUnavailable, ""},
		{"first certificate", certPEM(first), http.StatusOK, "spiffe://torpor.local/space/default/actor/c1 serial=" + first.SerialNumber.Text(16) + "\n"},
		{"renewed", certPEM(renewed), http.StatusOK, "spiffe://torpor.local/space/default/actor/c1 serial=" + renewed.SerialNumber.Text(16) + "\n"},
		{"another actor", append(certPEM(other), certPEM(ca.CACertificate())...), http.StatusOK, "spiffe://torpor.local/space/default/actor/c2 serial=" + other.SerialNumber.Text(16) + "\n"},
		{"not a certificate", []byte("junk"), http.StatusInternalServerError, ""},
	}
	for _, s := range steps {
		if s.cert != nil {
			if err := os.WriteFile(filepath.Join(identityDir, "cert.pem"), s.cert, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		code, body := get(t, base+"/whoami")
		if code != s.wantCode || (s.want != "" && body != s.want) {
			t.Fatalf("%s: GET /whoami = %d %q, want %d %q", s.name, code, body, s.wantCode, s.want)
		}
	}
	// Identity does not disturb counting.
	if code, body := get(t, base+"/"); code != http.StatusOK || body != "count=1 lines=1\n" {
		t.Fatalf("GET / = %d %q, want count=1 lines=1", code, body)
	}
}
