package main

import (
	"context"
	"debug/elf"
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

	"github.com/torpor-dev/torpor/internal/image"
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

// startCounter runs the counter binary with a random port and dataDir as
// its volume, waits until it is ready and returns its base URL and a func
// that stops it.
func startCounter(t *testing.T, bin, dataDir string) (string, func()) {
	t.Helper()
	port := freePort(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port), "DATA_DIR="+dataDir)
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
	steps := []struct {
		restart  bool // stop the process and start a new one on the same volume
		path     string
		wantCode int
		want     string
	}{
		{path: "/", wantCode: 200, want: "count=1 lines=1\n"},
		{path: "/", wantCode: 200, want: "count=2 lines=2\n"},
		{path: "/readyz", wantCode: 200, want: "ready\n"},
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
	rootfs, err := image.Unpack(ctx, pinned, t.TempDir())
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
	cfg, err := image.Config(ctx, pinned)
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
