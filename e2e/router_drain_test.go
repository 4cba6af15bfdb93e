package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/router"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// TestRouterProcessDrainsOnSIGTERM: `torpor router` told to stop (SIGTERM)
// says so on /healthz at once, keeps accepting for --drain-delay, then
// refuses new connections while the request in flight (a resume on
// gVisor) finishes, closes the tunnel still open at the end of
// --drain-timeout, and exits 0.
func TestRouterProcessDrainsOnSIGTERM(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	c.createActor("c2", "counter")
	c.mustResume("c1")

	var tok struct {
		Token         string `json:"token"`
		CaFingerprint string `json:"caFingerprint"`
	}
	out := c.torporCLI("token", "create", "--client", "edge", "--role", "router", "--spaces", "default", "-o", "json")
	if err := json.Unmarshal([]byte(out), &tok); err != nil || tok.Token == "" {
		t.Fatalf("token create printed %q (%v)", out, err)
	}
	const delay, grace = time.Second, 3 * time.Second
	listen, metrics := testkit.FreeAddr(t), testkit.FreeAddr(t)
	proc := startProcess(t, "router", "router", "--name", "edge", "--server", c.api, "--ca-fingerprint", tok.CaFingerprint,
		"--join-token", tok.Token, "--state-dir", t.TempDir(), "--listen", listen, "--metrics-listen", metrics,
		"--drain-delay", delay.String(), "--drain-timeout", grace.String())
	c.ingress = "http://" + listen
	health := func() (int, string) {
		resp, err := http.Get("http://" + metrics + "/healthz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	deadline := time.Now().Add(time.Minute)
	for code, _ := health(); code != http.StatusOK; code, _ = health() {
		if !proc.running() || time.Now().After(deadline) {
			t.Fatal("the router process does not serve /healthz")
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A tunnel to c1, open across the drain.
	conn, err := net.DialTimeout("tcp", listen, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	authority := fmt.Sprintf("c1.default.%s:8080", router.DefaultDomain)
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: authority}, Host: authority,
		Header: http.Header{"Proxy-Authorization": {"Bearer " + c.conn.Token}}}
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	if resp, err := http.ReadResponse(br, req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT %s: %v %v", authority, resp, err)
	}
	tunnelClosed := make(chan time.Time, 1)
	go func() {
		io.Copy(io.Discard, br) //nolint:errcheck // ends when the router closes the tunnel
		tunnelClosed <- time.Now()
	}()

	// A request that resumes c2, in flight when SIGTERM comes.
	type result struct {
		code int
		body string
	}
	inFlight := make(chan result, 1)
	go func() {
		r, err := http.NewRequest(http.MethodGet, c.ingress+"/", nil)
		if err != nil {
			inFlight <- result{body: err.Error()}
			return
		}
		r.Host = "c2.default." + router.DefaultDomain
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			inFlight <- result{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		inFlight <- result{resp.StatusCode, string(b)}
	}()
	pollUntil(t, "the request to wait for c2's resume", func() bool {
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), "\ntorpor_router_parked_requests 1\n")
	})

	proc.signal(t, syscall.SIGTERM)
	term := time.Now()
	// The signal is delivered and handled a moment later: well within
	// the drain delay (1 s), /healthz answers 503.
	for code, body := health(); code != http.StatusServiceUnavailable || body != "draining"; code, body = health() {
		if time.Since(term) > 300*time.Millisecond {
			t.Errorf("/healthz 300 ms after SIGTERM: %d %q, want 503 draining", code, body)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Accepting through the delay, refused after it.
	if conn, err := net.Dial("tcp", listen); err != nil {
		t.Errorf("a connection within the drain delay: %v, want accepted", err)
	} else {
		conn.Close()
	}
	pollUntil(t, "the listener to close", func() bool {
		conn, err := net.Dial("tcp", listen)
		if err != nil {
			return true
		}
		conn.Close()
		return false
	})
	if closed := time.Since(term); closed < delay {
		t.Errorf("the listener closed %s after SIGTERM, before the drain delay %s", closed, delay)
	}
	if got := <-inFlight; got.code != http.StatusOK || !strings.HasPrefix(got.body, "count=") {
		t.Errorf("the request in flight across SIGTERM: %d %q, want the counter", got.code, got.body)
	}
	select {
	case at := <-tunnelClosed:
		if after := at.Sub(term); after < delay+grace-500*time.Millisecond {
			t.Errorf("the tunnel was closed %s after SIGTERM, before the grace period ended", after)
		}
	case <-time.After(time.Minute):
		t.Fatal("the tunnel is still open after the grace period")
	}
	select {
	case <-proc.exited:
	case <-time.After(time.Minute):
		t.Fatal("the router did not exit after its drain")
	}
	if code := proc.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("the router exited %d, want 0", code)
	}
}

// pollUntil polls cond every 10ms, for at most a minute.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
