package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/store"
)

// TestRequestIsReportedBeforeLookup: the first request for an actor the
// control plane has not heard of from this router is reported before the
// router asks where the actor runs (the ordering stopIdle relies on), and
// its end rides the next batch.
func TestRequestIsReportedBeforeLookup(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{ReportInterval: time.Hour, Name: "edge-1"})
	if status, body := tr.get(t, key, "/"); status != http.StatusOK {
		t.Fatalf("request: %d %q", status, body)
	}
	if n := e.callCount(torporv1connect.ActorServiceReportActivityProcedure); n != 1 {
		t.Fatalf("ReportActivity called %d times during the first request, want 1 (before the lookup)", n)
	}
	got, err := e.store.ActivityOf(context.Background(), []store.ActivityKey{{Space: key.Space, Name: key.Name}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Reporter != "edge-1" || got[0].InFlight != 1 {
		t.Fatalf("activity after the first request: %+v, want edge-1's with the request in flight", got)
	}
	// A second request right away rides the batch: no call of its own.
	if status, _ := tr.get(t, key, "/"); status != http.StatusOK {
		t.Fatalf("second request: %d", status)
	}
	if n := e.callCount(torporv1connect.ActorServiceReportActivityProcedure); n != 1 {
		t.Errorf("ReportActivity called %d times, want 1: a second request within a second is batched", n)
	}
	tr.reportBatch(context.Background())
	got, err = e.store.ActivityOf(context.Background(), []store.ActivityKey{{Space: key.Space, Name: key.Name}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].InFlight != 0 || got[0].LastActive.Before(time.Now().Add(-5*time.Second)) {
		t.Errorf("activity after the batch: %+v, want nothing in flight and a recent last activity", got)
	}
}

// TestRouterReportsOnlyItsSpaces: a router limited to some spaces cannot
// report activity of others (the control plane refuses the batch).
func TestRouterReportsOnlyItsSpaces(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{ReportInterval: time.Hour, HTTPClient: e.routerClient("other")})
	tr.actors.enter(key, time.Now())
	err := tr.sendReport(context.Background(), tr.actors.unreported())
	if err == nil {
		t.Fatal("a router of space other reported activity in space default")
	}
	got, err := e.store.ActivityOf(context.Background(), []store.ActivityKey{{Space: key.Space, Name: key.Name}})
	if err != nil || len(got) != 0 {
		t.Errorf("activity stored: %+v, %v; want none", got, err)
	}
}

func TestIdlePolicy(t *testing.T) {
	tests := []struct {
		action    torporv1.IdleAction
		wantState torporv1.ActorState
	}{
		{torporv1.IdleAction_IDLE_ACTION_SUSPEND, torporv1.ActorState_ACTOR_STATE_SUSPENDED},
		{torporv1.IdleAction_IDLE_ACTION_PAUSE, torporv1.ActorState_ACTOR_STATE_PAUSED},
	}
	for _, tt := range tests {
		t.Run(tt.action.String(), func(t *testing.T) {
			e := newEnv(t, 1, helloWorkload)
			key := e.createActor("app", &torporv1.IdlePolicy{IdleSeconds: 1, Action: tt.action})
			tr := e.newRouter(Config{ReportInterval: 50 * time.Millisecond})
			if status, body := tr.get(t, key, "/"); status != http.StatusOK {
				t.Fatalf("first request: %d %q", status, body)
			}
			e.waitState(key, tt.wantState)
			events, err := e.actors.ListActorEvents(context.Background(), connect.NewRequest(&torporv1.GetRequest{Space: key.Space, Name: key.Name}))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(events.Msg.GetEvents(), func(ev *torporv1.ActorEvent) bool { return strings.HasPrefix(ev.GetReason(), "idle for ") }) {
				t.Errorf("no event says the actor was stopped for being idle: %v", events.Msg.GetEvents())
			}
			if status, body := tr.get(t, key, "/again"); status != http.StatusOK || body != "hello from app at /again" {
				t.Fatalf("request after idling: %d %q", status, body)
			}
			if n := e.agent.count("Restore"); n != 1 {
				t.Errorf("restored %d times, want 1", n)
			}
			if got := e.state(key); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
				t.Errorf("actor is %s after the request, want RUNNING", got)
			}
		})
	}
}

func TestIdlePolicyWaitsForOpenStreams(t *testing.T) {
	finish := make(chan struct{})
	e := newEnv(t, 1, func(string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "open\n")
			http.NewResponseController(w).Flush()
			select {
			case <-finish:
			case <-r.Context().Done():
			}
		})
	})
	key := e.createActor("app", &torporv1.IdlePolicy{IdleSeconds: 1, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND})
	tr := e.newRouter(Config{ReportInterval: 50 * time.Millisecond})
	resp, err := http.DefaultClient.Do(tr.request(t, http.MethodGet, key, "/stream", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "open\n" {
		t.Fatalf("stream start %q, %v", line, err)
	}
	opened := time.Now()
	// A sweep of the control plane past the idle period since the
	// actor's last activity but the stream: the open stream the router
	// reports keeps the actor running.
	e.waitSweptAfter(t, opened.Add(time.Second))
	if got := e.state(key); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("actor is %s with a stream open, want RUNNING", got)
	}
	if n := e.agent.count("Checkpoint"); n != 0 {
		t.Fatalf("checkpointed %d times with a stream open", n)
	}
	close(finish)
	io.Copy(io.Discard, resp.Body)
	e.waitState(key, torporv1.ActorState_ACTOR_STATE_SUSPENDED)
}

func TestRequestDuringIdleSuspendWaitsAndResumes(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", &torporv1.IdlePolicy{IdleSeconds: 1, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND})
	tr := e.newRouter(Config{ReportInterval: 50 * time.Millisecond})
	entered, release := e.agent.gate("Checkpoint")
	defer release()
	if status, body := tr.get(t, key, "/"); status != http.StatusOK {
		t.Fatalf("first request: %d %q", status, body)
	}
	<-entered // the idle suspend is checkpointing
	type answer struct {
		status int
		body   string
	}
	done := make(chan answer, 1)
	go func() {
		status, body := tr.get(t, key, "/during")
		done <- answer{status, body}
	}()
	waitFor(t, "the request to arrive", func() bool {
		tr.actors.mu.Lock()
		defer tr.actors.mu.Unlock()
		return tr.actors.m[key] != nil && tr.actors.m[key].inflight == 1
	})
	release()
	if a := <-done; a.status != http.StatusOK || a.body != "hello from app at /during" {
		t.Fatalf("request during the suspend: %d %q", a.status, a.body)
	}
	if n := e.agent.count("Restore"); n != 1 {
		t.Errorf("restored %d times, want 1", n)
	}
}

// TestTwoRoutersOneActor: two routers serve one actor side by side; a
// request open on one keeps the actor running however long the other has
// been idle for it (the control plane sums their in-flight counts), and
// once it ends the actor is idle-suspended.
func TestTwoRoutersOneActor(t *testing.T) {
	release := make(chan struct{})
	e := newEnv(t, 1, func(actor string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				w.WriteHeader(http.StatusOK)
				http.NewResponseController(w).Flush()
				<-release
			}
			fmt.Fprintf(w, "hello from %s", actor)
		})
	})
	key := e.createActor("app", &torporv1.IdlePolicy{Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND, IdleSeconds: 1})
	a, b := e.newRouter(Config{Name: "edge-a"}), e.newRouter(Config{Name: "edge-b"})
	if status, body := a.get(t, key, "/"); status != http.StatusOK {
		t.Fatalf("through router a: %d %q", status, body)
	}
	resp, err := http.DefaultClient.Do(b.request(t, http.MethodGet, key, "/slow", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	opened := time.Now()
	// Sweeps past the idle period since router a's last request (and
	// since b's request began): b's open request keeps the actor.
	e.waitSweptAfter(t, opened.Add(2*time.Second))
	if got := e.state(key); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("actor is %s with a request open on router b, want RUNNING", got)
	}
	// Router a still routes to it meanwhile.
	if status, body := a.get(t, key, "/"); status != http.StatusOK || body != "hello from app" {
		t.Fatalf("through router a while b serves: %d %q", status, body)
	}
	close(release)
	io.ReadAll(resp.Body)
	e.waitState(key, torporv1.ActorState_ACTOR_STATE_SUSPENDED)
}
