package workflow

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// TestForceDelete: a running actor is deleted only with force, in one
// call: its workload stopped on the node (no checkpoint), its worker
// freed, its record gone. A forced delete cut short after its intent
// (the node out of reach) leaves the actor DELETING on its worker, and a
// new control plane's Recover finishes it.
func TestForceDelete(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	e.createActor("c2")
	e.resume("c1", ResumeOptions{})
	agent := e.agents["n1"]
	if err := e.engine.Delete(e.ctx, "default", "c1", DeleteOptions{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("delete of a running actor without force: %v, want FailedPrecondition", err)
	}
	if err := e.engine.Delete(e.ctx, "default", "c1", DeleteOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Actors().Get(e.ctx, "default", "c1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("force-deleted actor still there: %v", err)
	}
	if n := agent.callCount("Checkpoint"); n != 0 {
		t.Fatalf("a forced delete checkpointed %d times", n)
	}
	if len(agent.slots) != 0 {
		t.Fatalf("the workload still runs on the node: %v", agent.slots)
	}
	e.checkPlacement()

	// Cut short: the node does not answer until the caller gives up.
	e.resume("c2", ResumeOptions{})
	agent.down.Store(true)
	ctx, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
	defer cancel()
	if err := e.engine.Delete(ctx, "default", "c2", DeleteOptions{Force: true}); err == nil {
		t.Fatal("a forced delete whose node never answered succeeded")
	}
	a := e.actor("c2")
	if a.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_DELETING || a.GetStatus().GetWorker() == nil {
		t.Fatalf("after the cut: %v on worker %v, want DELETING still holding its worker", a.GetStatus().GetState(), a.GetStatus().GetWorker())
	}
	e.checkPlacement()
	agent.down.Store(false)
	fresh := New(e.store, e.agents, e.objects, Options{HeartbeatTimeout: time.Minute}, slog.New(slog.DiscardHandler))
	if err := fresh.Recover(e.ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Actors().Get(e.ctx, "default", "c2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("recovered forced delete left the actor: %v", err)
	}
	if len(agent.slots) != 0 {
		t.Fatalf("the workload still runs on the node: %v", agent.slots)
	}
	e.checkPlacement()
}
