package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// routerGet sends one request for actor's / through the router.
func (c *cluster) routerGet(actor string) (int, http.Header, string) {
	c.t.Helper()
	return c.routerGetPath(actor, "/")
}

// routerGetPath sends GET path for actor through the router and returns
// the status, headers and trimmed body.
func (c *cluster) routerGetPath(actor, path string) (int, http.Header, string) {
	c.t.Helper()
	return c.routerGetIn("default", actor, path)
}

// routerGetIn is routerGetPath for an actor of space.
func (c *cluster) routerGetIn(space, actor, path string) (int, http.Header, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.ingress+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Host = actor + "." + space + ".actors.localhost"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, strings.TrimSpace(string(body))
}

// metric reads one sample from a /metrics page.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(page)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (c *cluster) resumeEvents(actor string) int {
	n := 0
	for _, ev := range c.events(actor) {
		if ev.GetToState() == torporv1.ActorState_ACTOR_STATE_RESUMING {
			n++
		}
	}
	return n
}

func TestRouterResumesOnDemandOnce(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	admin := httptest.NewServer(c.router.Admin())
	defer admin.Close()

	const n = 20
	var wg sync.WaitGroup
	bodies := make(chan string, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, body := c.routerGet("c1")
			if code != http.StatusOK {
				t.Errorf("status %d: %s", code, body)
			}
			bodies <- body
		}()
	}
	wg.Wait()
	close(bodies)
	seen := map[string]bool{}
	for b := range bodies {
		seen[b] = true
	}
	for i := 1; i <= n; i++ {
		if want := fmt.Sprintf("count=%d lines=%d", i, i); !seen[want] {
			t.Errorf("no response %q among %v", want, seen)
		}
	}
	if got := c.resumeEvents("c1"); got != 1 {
		t.Fatalf("%d concurrent requests caused %d resumes, want 1", n, got)
	}
	if got := metric(t, admin.URL+"/metrics", `torpor_router_resumes_total{result="running"}`); got != 1 {
		t.Fatalf("router counted %v resumes, want 1", got)
	}
	server := httptest.NewServer(c.server.Handler())
	defer server.Close()
	if got := metric(t, server.URL+"/metrics", `torpor_workflow_steps_total{kind="resume",result="ok"}`); got != 1 {
		t.Fatalf("server counted %v resumes, want 1", got)
	}
}

func TestIdlePolicySuspendsAndNextRequestResumes(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	c.applyTemplate(counterTemplate(t, "idle", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 3, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND}
	}))
	c.createActor("c1", "idle")
	for i := 1; i <= 2; i++ {
		if code, _, body := c.routerGet("c1"); code != http.StatusOK || body != fmt.Sprintf("count=%d lines=%d", i, i) {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	idleSince := time.Now()
	c.waitFor("the idle actor to suspend itself", func() bool {
		return c.actor("c1").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_SUSPENDED
	})
	if waited := time.Since(idleSince); waited < 3*time.Second {
		t.Fatalf("suspended after %s of idleness, the policy says 3s", waited)
	}
	if code, _, body := c.routerGet("c1"); code != http.StatusOK || body != "count=3 lines=3" {
		t.Fatalf("request after the idle suspend: %d %q, want count=3 lines=3", code, body)
	}
}

func TestNoCapacityAnswers503(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1, parkTimeout: time.Second})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	// The worker's actor is never evicted: nothing can make room.
	c.applyTemplate(counterTemplate(t, "pinned", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{Eviction: &torporv1.EvictionPolicy{Never: true}}
	}))
	c.createActor("busy", "pinned")
	c.createActor("waiting", "counter")
	if code, _, body := c.routerGet("busy"); code != http.StatusOK {
		t.Fatalf("first actor: %d %s", code, body)
	}
	start := time.Now()
	code, header, body := c.routerGet("waiting")
	if code != http.StatusServiceUnavailable || header.Get("Retry-After") == "" {
		t.Fatalf("with every worker busy: %d (Retry-After %q) %s, want 503 with Retry-After", code, header.Get("Retry-After"), body)
	}
	if parked := time.Since(start); parked < time.Second {
		t.Fatalf("answered after %s, before the 1s parking bound", parked)
	}
	if st := c.actor("waiting").GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("the refused actor is %v, want SUSPENDED", st)
	}
}

// TestRouterFollowsAnActorMovedBehindItsBack: c1 is suspended through the
// API and its worker given to another actor; the router must not send c1's
// next request to the address it last saw.
func TestRouterFollowsAnActorMovedBehindItsBack(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	c.createActor("holder", "counter")
	if code, _, body := c.routerGet("c1"); code != http.StatusOK || body != "count=1 lines=1" {
		t.Fatalf("first request: %d %q", code, body)
	}
	first := c.actor("c1").GetStatus().GetWorker().GetName()
	c.suspend("c1")
	if got := c.mustResume("holder").GetStatus().GetWorker().GetName(); got != first {
		t.Fatalf("holder took %s, the test needs it on c1's old worker %s", got, first)
	}
	if code, _, body := c.routerGet("c1"); code != http.StatusOK || body != "count=2 lines=2" {
		t.Fatalf("request after c1 moved: %d %q, want c1's count=2 lines=2 (not the holder's workload)", code, body)
	}
}
