package router

import (
	"context"
	"net/http"
	"testing"
	"time"

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
