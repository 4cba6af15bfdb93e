package workflow

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
)

// DeleteOptions are a delete's choices.
type DeleteOptions struct {
	// Force deletes an actor whose workload runs (RUNNING, or a step
	// under way: RESUMING, SUSPENDING, PAUSING) in one call: the workload
	// is stopped without a snapshot, and what the interrupted step wrote
	// is removed.
	Force bool
}

// Delete removes an actor, with all its snapshots but those a tag keeps
// (untagging one of a deleted actor removes it). An actor holding a
// worker is deleted only with opts.Force. The DELETING intent is
// committed first, so a crash mid-way is finished by Recover.
func (e *Engine) Delete(ctx context.Context, space, name string, opts DeleteOptions) (err error) {
	start := e.now()
	defer func() { e.metrics.observe("delete", start, err) }()
	a, err := e.store.Actors().Get(ctx, space, name)
	if err != nil {
		return err
	}
	return e.deleteActor(ctx, a, opts, "")
}

// deleteActor is Delete of a as read: its DELETING intent is a
// compare-and-set on that version (Aborted when a changed since). why,
// when set, is the reason in the actor's history instead of the request.
func (e *Engine) deleteActor(ctx context.Context, a *torporv1.Actor, opts DeleteOptions, why string) error {
	switch state := a.GetStatus().GetState(); {
	case state == torporv1.ActorState_ACTOR_STATE_DELETING:
	case state == torporv1.ActorState_ACTOR_STATE_SUSPENDED, state == torporv1.ActorState_ACTOR_STATE_PAUSED, state == torporv1.ActorState_ACTOR_STATE_CRASHED,
		opts.Force && holdsWorker(state):
		op := &torporv1.ActorOperation{Id: newOperationID(), Kind: torporv1.OperationKind_OPERATION_KIND_DELETE, StartTime: timestamppb.New(e.now()), PreviousState: state}
		reason := "delete requested"
		if holdsWorker(state) {
			reason = fmt.Sprintf("delete requested with force: the %s workload is stopped without a snapshot", enum.Name(state))
		}
		if why != "" {
			reason = why
		}
		if holdsWorker(state) {
			// What the interrupted step may have written, for the delete
			// to remove (Recover too, from the intent).
			if k := a.GetStatus().GetOperation().GetKind(); k == torporv1.OperationKind_OPERATION_KIND_SUSPEND || k == torporv1.OperationKind_OPERATION_KIND_PAUSE {
				op.TargetSnapshot = a.GetStatus().GetOperation().GetTargetSnapshot()
			}
		}
		a.Status.Operation = op
		if err := e.setState(a, torporv1.ActorState_ACTOR_STATE_DELETING); err != nil {
			return err
		}
		// The transaction may run more than once (the store retries it
		// through a database restart): it writes the claim as read.
		var claimed *torporv1.Actor
		err := e.store.InTx(ctx, func(tx store.Tx) error {
			var err error
			if claimed, err = tx.Actors().Update(ctx, a); err != nil {
				return err
			}
			return e.record(ctx, tx, claimed.GetMetadata().GetUid(), transition{from: state, to: torporv1.ActorState_ACTOR_STATE_DELETING, reason: reason, op: op, worker: a.GetStatus().GetWorker()})
		})
		if errors.Is(err, store.ErrConflict) {
			return errdefs.Errorf(errdefs.ErrAborted, "actor %s changed while deleting: retry", actorKey(a))
		}
		if err != nil {
			return err
		}
		a = claimed
	default:
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s is %s: suspend it before deleting, or delete it with force to stop it without a snapshot", actorKey(a), enum.Name(state))
	}
	return e.driveDelete(ctx, a)
}

func (e *Engine) driveDelete(ctx context.Context, a *torporv1.Actor) error {
	if a.GetStatus().GetWorker() != nil {
		var err error
		if a, err = e.stopForDelete(ctx, a); err != nil {
			return fmt.Errorf("delete actor %s: %w", actorKey(a), err)
		}
	}
	e.dropKeptLog(ctx, a)
	snaps, err := e.actorSnapshots(ctx, a)
	if err != nil {
		return err
	}
	// Those a tag keeps stay (removeSnapshot asks referencesOf).
	after := lettingGo(a)
	for _, s := range snaps {
		if err := e.removeSnapshot(ctx, after, s); err != nil {
			return fmt.Errorf("delete actor %s: remove snapshot %s: %w", actorKey(a), s.GetMetadata().GetName(), err)
		}
	}
	m := a.GetMetadata()
	if err := e.store.Actors().Delete(ctx, m.GetSpace(), m.GetName(), m.GetUid(), 0); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("delete actor %s: %w", actorKey(a), err)
	}
	e.logger(a).Info("actor deleted", "snapshots", len(snaps))
	return nil
}

// stopForDelete stops the workload of a forced delete on its worker
// (its log and volumes go too), removes what the step it interrupted
// wrote, and releases the worker with the actor, in one transaction. A
// node that is lost meanwhile drops the workload itself when it
// registers again (the worker no longer hosts it).
func (e *Engine) stopForDelete(ctx context.Context, a *torporv1.Actor) (*torporv1.Actor, error) {
	st := a.GetStatus()
	w := st.GetWorker()
	moved, err := e.untilNodeAnswers(ctx, a, func(ctx context.Context) error {
		agent, err := e.agents.Agent(ctx, w.GetNode())
		if err != nil {
			return err
		}
		// The node runs one operation of a worker at a time: once this
		// answers, the step it interrupted has ended there.
		_, err = agent.Terminate(ctx, connect.NewRequest(&torporv1.TerminateRequest{
			Op:      &torporv1.Operation{ActorUid: a.GetMetadata().GetUid(), OperationId: st.GetOperation().GetId() + "-terminate", Worker: w.GetName()},
			DropLog: true,
		}))
		return err
	})
	switch {
	case moved != nil:
		return nil, errdefs.Errorf(errdefs.ErrAborted, "actor %s changed while deleting: retry", actorKey(a))
	case err != nil && !errors.Is(err, errNodeLost):
		return nil, fmt.Errorf("stop its workload on worker %s: %w", w.GetName(), err)
	}
	if target := st.GetOperation().GetTargetSnapshot(); target != "" {
		e.removeInterrupted(ctx, a, target)
	}
	var out *torporv1.Actor
	err = e.inSameStep(ctx, a, func(tx store.Tx, cur *torporv1.Actor) error {
		if err := releaseWorker(ctx, tx, cur.GetStatus().GetWorker(), cur.GetMetadata().GetUid()); err != nil {
			return err
		}
		cur.Status.Worker = nil
		var err error
		out, err = tx.Actors().Update(ctx, cur)
		return err
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		return nil, errdefs.Errorf(errdefs.ErrAborted, "actor %s changed while deleting: retry", actorKey(a))
	}
	return out, nil
}

// removeInterrupted removes the files a suspend or pause that a forced
// delete interrupted may have written (snapshot target of a), which no
// record names.
func (e *Engine) removeInterrupted(ctx context.Context, a *torporv1.Actor, target string) {
	location, err := snapshot.Location(a.GetMetadata().GetSpace(), a.GetMetadata().GetUid(), target)
	if err != nil {
		e.logger(a).Warn("interrupted checkpoint not removed", "snapshot", target, "err", err)
		return
	}
	interrupted := &torporv1.Snapshot{Metadata: &torporv1.ObjectMeta{Space: a.GetMetadata().GetSpace(), Name: target}, Location: location}
	if a.GetStatus().GetOperation().GetPreviousState() == torporv1.ActorState_ACTOR_STATE_PAUSING {
		interrupted.Node = a.GetStatus().GetWorker().GetNode()
	}
	if err := e.removeSnapshotFiles(ctx, interrupted); err != nil {
		e.logger(a).Warn("interrupted checkpoint not removed", "snapshot", target, "err", err)
	}
}

// dropKeptLog asks the node that keeps a crashed actor's log to remove
// it. Best effort: a node out of reach lets it go among the oldest it
// keeps.
func (e *Engine) dropKeptLog(ctx context.Context, a *torporv1.Actor) {
	w := a.GetStatus().GetLastWorker()
	if w == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, terminateTimeout)
	defer cancel()
	agent, err := e.agents.Agent(ctx, w.GetNode())
	if err == nil {
		_, err = agent.Terminate(ctx, connect.NewRequest(&torporv1.TerminateRequest{
			Op:      &torporv1.Operation{ActorUid: a.GetMetadata().GetUid(), OperationId: a.GetStatus().GetOperation().GetId() + "-drop-log", Worker: w.GetName()},
			DropLog: true,
		}))
	}
	if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
		e.logger(a).Warn("the log its node kept not removed", "node", w.GetNode(), "err", err)
	}
}
