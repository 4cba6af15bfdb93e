package workflow

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// TestCloseStopsTheDrivers: a step whose caller stopped waiting goes on
// in a driver of its own; Close cancels that driver and waits for it, so
// no goroutine of the engine outlives it, and leaves the step in flight
// for Recover, which finishes it. Before, the driver ran on after the
// engine's owner had closed the store under it.
func TestCloseStopsTheDrivers(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	// The store's own goroutines (opened by newEnv) are not the engine's.
	before := goleak.IgnoreCurrent()

	agent := e.agents["n1"]
	agent.down.Store(true)
	ctx, cancel := context.WithTimeout(e.ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := e.engine.Resume(ctx, "default", "c1", ResumeOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("resume against a node that does not answer: %v, want the caller to stop waiting", err)
	}
	e.waitUntil("the detached driver to call the node again", func() bool { return agent.unanswered.Load() >= 3 })

	closed := make(chan struct{})
	go func() {
		defer close(closed)
		e.engine.Close()
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return: a driver ignores its cancellation")
	}
	goleak.VerifyNone(t, before)
	wantState(t, e.actor("c1"), torporv1.ActorState_ACTOR_STATE_RESUMING)

	agent.down.Store(false)
	next := New(e.store, e.agents, e.objects, Options{HeartbeatTimeout: time.Minute}, e.engine.log)
	defer next.Close()
	if err := next.Recover(e.ctx, 0); err != nil {
		t.Fatal(err)
	}
	wantState(t, e.actor("c1"), torporv1.ActorState_ACTOR_STATE_RUNNING)
}

// TestDriveAfterClose: a step committed after Close is not driven; it is
// left in flight for Recover, and its caller is told so.
func TestDriveAfterClose(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.engine.Close()
	a := &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "c1"},
		Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDING, Operation: &torporv1.ActorOperation{Id: "op-1"}},
	}
	_, err := e.engine.drive(e.ctx, a, func(context.Context) (*torporv1.Actor, error) {
		t.Error("a driver ran after Close")
		return nil, nil
	})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("drive after Close: %v, want unavailable", err)
	}
}
