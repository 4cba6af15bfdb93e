package workflow

import (
	"errors"
	"strings"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

func (e *env) cordon(node string, c Cordon) {
	e.t.Helper()
	if err := e.engine.SetCordon(e.ctx, node, c); err != nil {
		e.t.Fatal(err)
	}
}

func nodeOf(a *torporv1.Actor) string { return a.GetStatus().GetWorker().GetNode() }

func TestCordonedNodeTakesNoNewActors(t *testing.T) {
	e := newEnv(t, 2, "n1", "n2")
	e.cordon("n1", Cordon{Cordoned: true, Reason: "Kubernetes node n1 is cordoned"})
	for _, name := range []string{"c1", "c2"} {
		e.createActor(name)
		if got := nodeOf(e.resume(name, ResumeOptions{})); got != "n2" {
			t.Fatalf("%s placed on %s, a cordoned node", name, got)
		}
	}
	e.createActor("c3")
	err := e.resumeErr("c3", ResumeOptions{})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "cordoned") {
		t.Fatalf("resume with only a cordoned node's workers free: %v, want ResourceExhausted naming the cordon", err)
	}
	e.cordon("n1", Cordon{})
	if got := nodeOf(e.resume("c3", ResumeOptions{})); got != "n1" {
		t.Fatalf("c3 placed on %s after the cordon was lifted, want n1", got)
	}
	e.checkPlacement()
}

// A paused actor's newest state is only on its node: a cordon must not
// make its resume fall back to an older durable snapshot.
func TestCordonKeepsPausedActorsState(t *testing.T) {
	e := newEnv(t, 1, "n1", "n2")
	e.createActor("c1")
	node := nodeOf(e.resume("c1", ResumeOptions{}))
	if _, err := e.engine.Pause(e.ctx, "default", "c1"); err != nil {
		t.Fatal(err)
	}
	e.cordon(node, Cordon{Cordoned: true, Reason: "test"})
	r := e.resume("c1", ResumeOptions{})
	if nodeOf(r) != node || r.GetStatus().GetLocalCheckpoint() != "" {
		t.Fatalf("paused actor resumed on %s (local checkpoint %q), want its cordoned node %s from the checkpoint", nodeOf(r), r.GetStatus().GetLocalCheckpoint(), node)
	}
}

func TestDrainMovesEveryActorToStorage(t *testing.T) {
	e := newEnv(t, 2, "n1", "n2")
	// Fill n1 (the lowest name is placed first): one running, one paused.
	for _, name := range []string{"run", "paused"} {
		e.createActor(name)
		if got := nodeOf(e.resume(name, ResumeOptions{})); got != "n1" {
			t.Fatalf("%s on %s, want n1", name, got)
		}
	}
	if _, err := e.engine.Pause(e.ctx, "default", "paused"); err != nil {
		t.Fatal(err)
	}
	if err := e.engine.Drain(e.ctx, "n1"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("drain of a node not draining: %v, want FailedPrecondition", err)
	}
	e.cordon("n1", Cordon{Draining: true, Reason: "drain"})
	if err := e.engine.Drain(e.ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"run", "paused"} {
		a := e.actor(name)
		wantState(t, a, torporv1.ActorState_ACTOR_STATE_SUSPENDED)
		if a.GetStatus().GetLatestSnapshot() == "" || a.GetStatus().GetLocalCheckpoint() != "" {
			t.Fatalf("%s after the drain: latest snapshot %q, local checkpoint %q; want a durable snapshot only", name, a.GetStatus().GetLatestSnapshot(), a.GetStatus().GetLocalCheckpoint())
		}
		if got := nodeOf(e.resume(name, ResumeOptions{})); got != "n2" {
			t.Fatalf("%s resumed on %s after n1 was drained, want n2", name, got)
		}
	}
	// A second drain finds nothing left and succeeds.
	if err := e.engine.Drain(e.ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	e.checkPlacement()
}

func TestForgetNodeCrashesItsActorsAtOnce(t *testing.T) {
	e := newEnv(t, 1, "n1", "n2")
	e.createActor("c1")
	if nodeOf(e.resume("c1", ResumeOptions{})) != "n1" {
		t.Fatal("c1 not on n1")
	}
	snap := e.suspend("c1").GetStatus().GetLatestSnapshot()
	if nodeOf(e.resume("c1", ResumeOptions{})) != "n1" {
		t.Fatal("c1 not back on n1")
	}
	if err := e.engine.ForgetNode(e.ctx, "n1", "Kubernetes node n1 was deleted"); err != nil {
		t.Fatal(err)
	}
	a := e.actor("c1")
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_CRASHED)
	if !strings.Contains(a.GetStatus().GetCrashReason(), "Kubernetes node n1 was deleted") {
		t.Fatalf("crash reason %q does not name the deletion", a.GetStatus().GetCrashReason())
	}
	if _, err := e.store.Nodes().Get(e.ctx, "", "n1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("node record after ForgetNode: %v, want NotFound", err)
	}
	workers, err := store.ListAll(e.ctx, e.store.Workers(), store.ListOptions{Filter: store.Filter{"node": "n1"}})
	if err != nil || len(workers) != 0 {
		t.Fatalf("workers of the forgotten node: %d (%v), want none", len(workers), err)
	}
	r := e.resume("c1", ResumeOptions{})
	if nodeOf(r) != "n2" || r.GetStatus().GetLatestSnapshot() != snap {
		t.Fatalf("recovered on %s from %q, want n2 from its latest snapshot %s", nodeOf(r), r.GetStatus().GetLatestSnapshot(), snap)
	}
	e.checkPlacement()
}

// Every control-plane replica drains: one replica's list of the node's
// actors may be older than another's drain and the resume, by traffic,
// that moved an actor to another node since. The drain leaves that actor
// running where it is now.
func TestDrainLeavesAnActorThatMovedSinceTheList(t *testing.T) {
	e := newEnv(t, 1, "n1", "n2")
	e.createActor("moved")
	if got := nodeOf(e.resume("moved", ResumeOptions{})); got != "n1" {
		t.Fatalf("moved on %s, want n1", got)
	}
	listed := e.actor("moved") // as a drain of n1 lists it
	e.cordon("n1", Cordon{Draining: true, Reason: "drain"})
	e.suspend("moved") // another replica's drain
	if got := nodeOf(e.resume("moved", ResumeOptions{})); got != "n2" {
		t.Fatalf("moved resumed on %s while n1 drains, want n2", got)
	}
	if err := e.engine.drainActor(e.ctx, "n1", listed); err != nil {
		t.Fatal(err)
	}
	a := e.actor("moved")
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_RUNNING)
	if nodeOf(a) != "n2" {
		t.Fatalf("moved after the stale drain: on %s, want still on n2", nodeOf(a))
	}
	e.checkPlacement()
}
