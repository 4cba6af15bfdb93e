package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// TestIdlePolicyAppliesWhoeverResumed: the control plane applies the idle
// policy to actors resumed through the API, which a router has never
// seen: the quiet one is suspended once it has been idle for 5s, the one
// with a request through the router every second stays RUNNING (and
// keeps its count).
func TestIdlePolicyAppliesWhoeverResumed(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	c.applyTemplate(counterTemplate(t, "idle5", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 5, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND}
	}))
	c.createActor("quiet", "idle5")
	c.createActor("busy", "idle5")
	c.mustResume("quiet")
	running := time.Now()
	c.mustResume("busy")
	count := 0
	for c.actor("quiet").GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		if time.Since(running) > time.Minute {
			t.Fatal("the quiet actor is still not suspended after a minute")
		}
		count++
		if code, _, body := c.routerGet("busy"); code != http.StatusOK || body != fmt.Sprintf("count=%d lines=%d", count, count) {
			t.Fatalf("request %d to the busy actor: %d %q", count, code, body)
		}
		time.Sleep(time.Second)
	}
	if idle := time.Since(running); idle < 5*time.Second {
		t.Fatalf("the quiet actor was suspended %s after it started, before its 5s idle time", idle)
	}
	// Another 7s of a request a second: more than the idle time, and the
	// busy actor never stops.
	for range 7 {
		count++
		if code, _, body := c.routerGet("busy"); code != http.StatusOK || body != fmt.Sprintf("count=%d lines=%d", count, count) {
			t.Fatalf("request %d to the busy actor: %d %q", count, code, body)
		}
		time.Sleep(time.Second)
	}
	if st := c.actor("busy").GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("the busy actor is %v, want RUNNING", st)
	}
	if got := c.resumeEvents("busy"); got != 1 {
		t.Errorf("the busy actor was resumed %d times, want 1", got)
	}
	found := false
	for _, ev := range c.events("quiet") {
		found = found || strings.HasPrefix(ev.GetReason(), "idle for ")
	}
	if !found {
		t.Errorf("the quiet actor's events do not say it was idle: %v", c.events("quiet"))
	}
	// The suspended actor's next request resumes it with its state.
	if code, _, body := c.routerGet("quiet"); code != http.StatusOK || body != "count=1 lines=1" {
		t.Fatalf("request to the suspended actor: %d %q, want count=1 lines=1", code, body)
	}
}
