package workflow

import (
	"strings"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
)

const (
	unspecified = torporv1.ActorState_ACTOR_STATE_UNSPECIFIED
	suspended   = torporv1.ActorState_ACTOR_STATE_SUSPENDED
	resuming    = torporv1.ActorState_ACTOR_STATE_RESUMING
	running     = torporv1.ActorState_ACTOR_STATE_RUNNING
	suspending  = torporv1.ActorState_ACTOR_STATE_SUSPENDING
	pausing     = torporv1.ActorState_ACTOR_STATE_PAUSING
	paused      = torporv1.ActorState_ACTOR_STATE_PAUSED
	crashed     = torporv1.ActorState_ACTOR_STATE_CRASHED
	deleting    = torporv1.ActorState_ACTOR_STATE_DELETING
)

var allStates = []torporv1.ActorState{unspecified, suspended, resuming, running, suspending, pausing, paused, crashed, deleting}

// TestTransitions covers every pair of states: the moves docs/architecture.md
// lists are the only ones setState makes.
func TestTransitions(t *testing.T) {
	if n := len(torporv1.ActorState_name); n != len(allStates) {
		t.Fatalf("ActorState has %d values, the test knows %d: add the new one to the table", n, len(allStates))
	}
	want := map[[2]torporv1.ActorState]bool{
		{suspended, resuming}: true, {suspended, deleting}: true,
		{paused, resuming}: true, {paused, deleting}: true,
		{crashed, resuming}: true, {crashed, deleting}: true,
		{paused, suspended}: true, {crashed, suspended}: true, // a revert
		{resuming, running}: true, {resuming, crashed}: true,
		{running, suspending}: true, {running, pausing}: true, {running, crashed}: true,
		{suspending, suspended}: true, {suspending, running}: true, {suspending, crashed}: true,
		{pausing, paused}: true, {pausing, running}: true, {pausing, crashed}: true,
		// A forced delete.
		{resuming, deleting}: true, {running, deleting}: true, {suspending, deleting}: true, {pausing, deleting}: true,
	}
	e := &Engine{now: func() time.Time { return time.Unix(1000, 0) }}
	for _, from := range allStates {
		for _, to := range allStates {
			ok := want[[2]torporv1.ActorState{from, to}]
			if got := allowed(from, to); got != ok {
				t.Errorf("allowed(%s, %s) = %v, want %v", enum.Name(from), enum.Name(to), got, ok)
			}
			a := &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "s", Name: "a"}, Status: &torporv1.ActorStatus{State: from}}
			if holdsWorker(to) {
				a.Status.Worker = &torporv1.WorkerRef{Name: "w"}
			}
			err := e.setState(a, to)
			switch {
			case ok && (err != nil || a.GetStatus().GetState() != to || !a.GetStatus().GetStateTime().AsTime().Equal(time.Unix(1000, 0))):
				t.Errorf("setState %s → %s: %v, state %s at %v", enum.Name(from), enum.Name(to), err, enum.Name(a.GetStatus().GetState()), a.GetStatus().GetStateTime())
			case !ok && (err == nil || !strings.Contains(err.Error(), "no transition") || a.GetStatus().GetState() != from):
				t.Errorf("setState %s → %s: %v, state %s; want it refused and the state kept", enum.Name(from), enum.Name(to), err, enum.Name(a.GetStatus().GetState()))
			}
		}
	}
}

// TestSetStateChecksPlacement: a state that holds a worker goes with a
// worker in the status, and one that does not, without (invariant 1).
func TestSetStateChecksPlacement(t *testing.T) {
	e := &Engine{now: time.Now}
	for _, tt := range []struct {
		from, to torporv1.ActorState
		worker   bool
	}{
		{suspended, resuming, false},
		{running, suspending, false},
		{suspending, suspended, true},
		{resuming, crashed, true},
	} {
		a := &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "s", Name: "a"}, Status: &torporv1.ActorStatus{State: tt.from}}
		if tt.worker {
			a.Status.Worker = &torporv1.WorkerRef{Name: "w"}
		}
		if err := e.setState(a, tt.to); err == nil || a.GetStatus().GetState() != tt.from {
			t.Errorf("setState %s → %s with worker %v = %v; want it refused", enum.Name(tt.from), enum.Name(tt.to), tt.worker, err)
		}
	}
}

func TestStatePredicates(t *testing.T) {
	for _, tt := range []struct {
		state                           torporv1.ActorState
		inFlight, holdsWorker, onWorker bool
	}{
		{unspecified, false, false, false},
		{suspended, false, false, false},
		{resuming, true, true, true},
		{running, false, true, false},
		{suspending, true, true, true},
		{pausing, true, true, true},
		{paused, false, false, false},
		{crashed, false, false, false},
		{deleting, true, false, false},
	} {
		if got := inFlight(tt.state); got != tt.inFlight {
			t.Errorf("inFlight(%s) = %v", enum.Name(tt.state), got)
		}
		if got := holdsWorker(tt.state); got != tt.holdsWorker {
			t.Errorf("holdsWorker(%s) = %v", enum.Name(tt.state), got)
		}
		if got := onWorkerStep(tt.state); got != tt.onWorker {
			t.Errorf("onWorkerStep(%s) = %v", enum.Name(tt.state), got)
		}
	}
}
