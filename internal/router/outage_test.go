package router

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// resumeCall is the one call a request to an actor the router does not
// place makes to the control plane.
const resumeCall = torporv1connect.ActorServiceResumeActorProcedure

// TestControlPlaneUnavailableIsRetried: a control plane that answers
// Unavailable for a while (its database restarting) costs the request
// latency, not an error.
func TestControlPlaneUnavailableIsRetried(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{ParkTimeout: 30 * time.Second})
	before := e.callCount(resumeCall)
	const refused = 3
	e.outage(resumeCall, refused)

	if status, body := tr.get(t, key, "/"); status != http.StatusOK || body != "hello from app at /" {
		t.Fatalf("got %d %q, want the actor's answer", status, body)
	}
	if n := e.callCount(resumeCall) - before; n != refused+1 {
		t.Errorf("%s called %d times, want %d refused and 1 answered", resumeCall, n, refused)
	}
}

// TestControlPlaneUnavailablePastParkBudget: a control plane that cannot
// answer for longer than the park bound gets the request a 503 with
// Retry-After, saying no more than that.
func TestControlPlaneUnavailablePastParkBudget(t *testing.T) {
	const park = 300 * time.Millisecond
	t.Run("refused", func(t *testing.T) {
		e := newEnv(t, 1, helloWorkload)
		key := e.createActor("app", nil)
		tr := e.newRouter(Config{ParkTimeout: park})
		e.outage(resumeCall, math.MaxInt64)

		resp, err := http.DefaultClient.Do(tr.request(t, http.MethodGet, key, "/", nil))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantUnavailable(t, resp.StatusCode, resp.Header, string(body))
		if n := e.callCount(resumeCall); n < 3 {
			t.Errorf("%s called %d times, want retries", resumeCall, n)
		}
		if n := tr.metric(t, "torpor_router_resumes_total", map[string]string{"result": resumeUnavailable}); n != 1 {
			t.Errorf("resumes_total{result=unavailable} = %v, want 1", n)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		// Nothing listens at the control plane's address: connect reports
		// the refused dial as Unavailable.
		r, err := New(Config{Server: "http://127.0.0.1:" + strconv.Itoa(testkit.FreePort(t)), ParkTimeout: park, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Host = "app." + testSpace + "." + DefaultDomain
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		wantUnavailable(t, rec.Code, rec.Header(), rec.Body.String())
	})
}

func wantUnavailable(t *testing.T, status int, header http.Header, body string) {
	t.Helper()
	if status != http.StatusServiceUnavailable || header.Get("Retry-After") != "1" {
		t.Fatalf("got %d (Retry-After %q) %q, want 503 with Retry-After 1", status, header.Get("Retry-After"), body)
	}
	if !strings.Contains(body, "the control plane is unavailable") {
		t.Errorf("body %q does not say why", body)
	}
	for _, internal := range []string{"credentials", "dial", "127.0.0.1"} {
		if strings.Contains(body, internal) {
			t.Errorf("body %q tells the client about the control plane's parts (%q)", body, internal)
		}
	}
}

// TestTunnelTokenCheckIsRetried: a tunnel's token check meeting a
// control plane that cannot answer for a while waits for it, as a resume
// does, instead of failing the tunnel.
func TestTunnelTokenCheckIsRetried(t *testing.T) {
	e := newEnv(t, 1, echoWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{ParkTimeout: 30 * time.Second})
	token := e.apiToken(testSpace)
	e.resume(key)
	const refused = 3
	before := e.callCount(getCall)
	e.outage(getCall, refused)
	resp, conn := tr.connectTunnel(t, fmt.Sprintf("app.%s.%s:%d", testSpace, DefaultDomain, e.port), http.Header{"Proxy-Authorization": {"Bearer " + token}})
	if conn == nil {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("CONNECT: %s %s, want the tunnel", resp.Status, body)
	}
	conn.Close()
	if n := e.callCount(getCall) - before; n != refused+1 {
		t.Errorf("%s called %d times, want %d refused and 1 answered", getCall, n, refused)
	}
}

const getCall = torporv1connect.ActorServiceGetActorProcedure
