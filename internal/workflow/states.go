package workflow

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
)

// The actor state machine (docs/architecture.md, "Actor states"). An actor
// is created SUSPENDED; every later change of its state is one of these
// moves, made by setState.
var transitions = map[torporv1.ActorState][]torporv1.ActorState{
	// A resume claims a worker; deleting needs none held. A revert sets a
	// PAUSED or CRASHED actor back to one of its snapshots, discarding the
	// local checkpoint or the crash: SUSPENDED, until it resumes from it.
	torporv1.ActorState_ACTOR_STATE_SUSPENDED: {torporv1.ActorState_ACTOR_STATE_RESUMING, torporv1.ActorState_ACTOR_STATE_DELETING},
	torporv1.ActorState_ACTOR_STATE_PAUSED:    {torporv1.ActorState_ACTOR_STATE_RESUMING, torporv1.ActorState_ACTOR_STATE_DELETING, torporv1.ActorState_ACTOR_STATE_SUSPENDED},
	torporv1.ActorState_ACTOR_STATE_CRASHED:   {torporv1.ActorState_ACTOR_STATE_RESUMING, torporv1.ActorState_ACTOR_STATE_DELETING, torporv1.ActorState_ACTOR_STATE_SUSPENDED},
	// A forced delete stops a workload that runs or is in a step
	// (DELETING then holds the worker until the workload is gone).
	torporv1.ActorState_ACTOR_STATE_RESUMING: {torporv1.ActorState_ACTOR_STATE_RUNNING, torporv1.ActorState_ACTOR_STATE_CRASHED, torporv1.ActorState_ACTOR_STATE_DELETING},
	torporv1.ActorState_ACTOR_STATE_RUNNING:  {torporv1.ActorState_ACTOR_STATE_SUSPENDING, torporv1.ActorState_ACTOR_STATE_PAUSING, torporv1.ActorState_ACTOR_STATE_CRASHED, torporv1.ActorState_ACTOR_STATE_DELETING},
	// A checkpoint that fails with the workload still running, or an idle
	// stop cancelled before the node was called, returns to RUNNING. A
	// revert of a RUNNING actor stops its workload through SUSPENDING
	// without a checkpoint (OPERATION_KIND_REVERT).
	torporv1.ActorState_ACTOR_STATE_SUSPENDING: {torporv1.ActorState_ACTOR_STATE_SUSPENDED, torporv1.ActorState_ACTOR_STATE_RUNNING, torporv1.ActorState_ACTOR_STATE_CRASHED, torporv1.ActorState_ACTOR_STATE_DELETING},
	torporv1.ActorState_ACTOR_STATE_PAUSING:    {torporv1.ActorState_ACTOR_STATE_PAUSED, torporv1.ActorState_ACTOR_STATE_RUNNING, torporv1.ActorState_ACTOR_STATE_CRASHED, torporv1.ActorState_ACTOR_STATE_DELETING},
	// DELETING ends with the record's removal, not another state.
	torporv1.ActorState_ACTOR_STATE_DELETING: nil,
}

// inFlightStates are the states of a step under way: its intent is
// committed and its node call may be running, so Recover re-drives it.
var inFlightStates = []torporv1.ActorState{
	torporv1.ActorState_ACTOR_STATE_RESUMING,
	torporv1.ActorState_ACTOR_STATE_SUSPENDING,
	torporv1.ActorState_ACTOR_STATE_PAUSING,
	torporv1.ActorState_ACTOR_STATE_DELETING,
}

// inFlight: a step is under way in state s.
func inFlight(s torporv1.ActorState) bool { return slices.Contains(inFlightStates, s) }

// holdsWorker: an actor in state s is placed on a worker (status.worker
// set, the worker's status.actor naming it), invariant 1.
func holdsWorker(s torporv1.ActorState) bool {
	switch s {
	case torporv1.ActorState_ACTOR_STATE_RESUMING, torporv1.ActorState_ACTOR_STATE_RUNNING,
		torporv1.ActorState_ACTOR_STATE_SUSPENDING, torporv1.ActorState_ACTOR_STATE_PAUSING:
		return true
	}
	return false
}

// onWorkerStep: a step is moving the actor onto or off its worker; its
// outcome is worth waiting for.
func onWorkerStep(s torporv1.ActorState) bool { return inFlight(s) && holdsWorker(s) }

// allowed reports whether an actor may move from one state to another.
func allowed(from, to torporv1.ActorState) bool {
	return slices.Contains(transitions[from], to)
}

// setState moves a (in memory) to state, stamping the time. A move the
// state machine does not allow, or a placement that does not match the
// new state, is a bug in the engine: an error, and nothing changes.
func (e *Engine) setState(a *torporv1.Actor, state torporv1.ActorState) error {
	from := a.GetStatus().GetState()
	if !allowed(from, state) {
		return fmt.Errorf("actor %s: no transition from %s to %s", actorKey(a), enum.Name(from), enum.Name(state))
	}
	// DELETING holds the worker of a forced delete until the workload is
	// gone, and none otherwise.
	if placed := a.GetStatus().GetWorker() != nil; placed != holdsWorker(state) && state != torporv1.ActorState_ACTOR_STATE_DELETING {
		return fmt.Errorf("actor %s: %s with worker %q", actorKey(a), enum.Name(state), a.GetStatus().GetWorker().GetName())
	}
	a.Status.State = state
	a.Status.StateTime = timestamppb.New(e.now())
	// Frozen is a condition of RUNNING only (frozen.go).
	a.Status.FrozenTime = nil
	if from == torporv1.ActorState_ACTOR_STATE_CRASHED && state != torporv1.ActorState_ACTOR_STATE_DELETING {
		// Kept only while CRASHED (see ActorStatus.last_worker), and for
		// its delete to remove the log that node keeps.
		a.Status.LastWorker = nil
	}
	return nil
}
