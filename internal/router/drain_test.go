package router

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestDrain: once the router drains, /healthz answers 503; the tunnels
// still open at the end of the grace period are closed, the ones that
// ended on their own are not waited for.
func TestDrain(t *testing.T) {
	e := newEnv(t, 1, echoWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{})
	token := e.apiToken(testSpace)
	e.resume(key)
	authority := fmt.Sprintf("app.%s.%s:%d", testSpace, DefaultDomain, e.port)
	open := func() io.ReadWriteCloser {
		resp, conn := tr.connectTunnel(t, authority, http.Header{"Proxy-Authorization": {"Bearer " + token}})
		if conn == nil {
			t.Fatalf("CONNECT: %s", resp.Status)
		}
		return conn
	}
	health := func() int {
		rec := httptest.NewRecorder()
		tr.Admin().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code
	}
	if code := health(); code != http.StatusOK {
		t.Fatalf("/healthz before the drain: %d", code)
	}
	tr.Drain()
	if code := health(); code != http.StatusServiceUnavailable {
		t.Fatalf("/healthz while draining: %d, want 503", code)
	}

	// Nothing open: nothing waited for.
	ended := open()
	ended.Close()
	waitFor(t, "the ended tunnel to be let go", func() bool { return len(tr.hijacked.open()) == 0 })
	start := time.Now()
	if n := tr.CloseHijacked(context.Background()); n != 0 || time.Since(start) > time.Second {
		t.Fatalf("CloseHijacked with nothing open closed %d after %s", n, time.Since(start))
	}

	tunnel := open()
	defer tunnel.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if n := tr.CloseHijacked(ctx); n != 1 {
		t.Fatalf("CloseHijacked closed %d connections, want the open tunnel", n)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Errorf("the open tunnel was closed before the grace period ended")
	}
	done := make(chan error, 1)
	go func() { _, err := io.ReadAll(tunnel); done <- err }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel is still open after CloseHijacked")
	}
}
