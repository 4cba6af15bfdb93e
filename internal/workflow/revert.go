package workflow

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// Revert brings an actor back to snapshot (empty: its latest durable
// snapshot) and resumes it from there. Newer state is discarded: a
// running workload is stopped without a checkpoint, a local checkpoint
// or a crash is dropped, and the actor's newer snapshots that no tag
// keeps are deleted. It goes in two steps, each crash-safe on its own:
// the actor is set SUSPENDED at the snapshot (from RUNNING through
// SUSPENDING, an operation Recover re-drives), then resumed as any
// suspended actor; a control plane that stops in between leaves it
// SUSPENDED there, to resume on its next request.
func (e *Engine) Revert(ctx context.Context, space, name, snapshot string) (a *torporv1.Actor, err error) {
	start := e.now()
	defer func() { e.metrics.observe("revert", start, err) }()
	rewound := false
	for range maxAttempts {
		a, err := e.store.Actors().Get(ctx, space, name)
		if err != nil {
			return nil, err
		}
		state := a.GetStatus().GetState()
		switch {
		case rewound:
			// From the snapshot now, whoever resumes it: a request may
			// have come first.
			return e.Resume(ctx, space, name, ResumeOptions{})
		case onWorkerStep(state):
			if err := e.waitForChange(ctx, space, name, a.GetMetadata().GetVersion()); err != nil {
				return nil, err
			}
			continue
		case state == torporv1.ActorState_ACTOR_STATE_DELETING:
			return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s is being deleted", actorKey(a))
		}
		target, err := e.revertTarget(ctx, a, snapshot)
		if err != nil {
			return nil, err
		}
		if state == torporv1.ActorState_ACTOR_STATE_RUNNING {
			claimed, err := e.claimDiscard(ctx, a, target)
			if errors.Is(err, errRetry) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if _, err := e.drive(ctx, claimed, func(ctx context.Context) (*torporv1.Actor, error) { return e.driveDiscard(ctx, claimed) }); err != nil {
				return nil, err
			}
		} else {
			newer, err := e.newerSnapshots(ctx, a, target)
			if err != nil {
				return nil, err
			}
			err = e.rewind(ctx, a, target, newer)
			if errors.Is(err, errRetry) {
				continue
			}
			if err != nil {
				return nil, err
			}
		}
		rewound = true
	}
	return nil, errdefs.Errorf(errdefs.ErrAborted, "actor %s/%s: too many concurrent changes, retry", space, name)
}

// revertTarget is the snapshot a revert of a goes back to: name, or the
// latest durable snapshot; one of a's, in snapshot storage.
func (e *Engine) revertTarget(ctx context.Context, a *torporv1.Actor, name string) (*torporv1.Snapshot, error) {
	if name == "" {
		name = a.GetStatus().GetLatestSnapshot()
	}
	if name == "" {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s has no snapshot in snapshot storage to revert to", actorKey(a))
	}
	snap, err := e.store.Snapshots().Get(ctx, a.GetMetadata().GetSpace(), name)
	if err != nil {
		return nil, err
	}
	switch {
	case snap.GetActorUid() != a.GetMetadata().GetUid():
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "snapshot %s belongs to another actor, not %s", name, actorKey(a))
	case snap.GetNode() != "":
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "snapshot %s is a local checkpoint on node %s: a revert goes back to a snapshot in snapshot storage", name, snap.GetNode())
	}
	return snap, nil
}

// newerSnapshots are a's durable snapshots taken after target that no tag
// keeps: the state a revert to target discards.
func (e *Engine) newerSnapshots(ctx context.Context, a *torporv1.Actor, target *torporv1.Snapshot) ([]*torporv1.Snapshot, error) {
	snaps, err := e.actorSnapshots(ctx, a)
	if err != nil {
		return nil, err
	}
	var newer []*torporv1.Snapshot
	for _, s := range snaps {
		if s.GetNode() == "" && s.GetMetadata().GetName() > target.GetMetadata().GetName() {
			newer = append(newer, s)
		}
	}
	// The actor as the revert leaves it: at target, with no local
	// checkpoint.
	after := proto.CloneOf(a)
	after.Status.LatestSnapshot, after.Status.LocalCheckpoint = target.GetMetadata().GetName(), ""
	return unheld(ctx, refSource{tx: e.store, after: after}, newer)
}

// rewind sets a, which holds no worker, SUSPENDED at target in one
// transaction: its local checkpoint and the newer snapshots are deleted
// (their files after the commit).
func (e *Engine) rewind(ctx context.Context, a *torporv1.Actor, target *torporv1.Snapshot, newer []*torporv1.Snapshot) error {
	space, from := a.GetMetadata().GetSpace(), a.GetStatus().GetState()
	reason := revertReason(target, newer)
	var dropped []*torporv1.Snapshot
	err := e.store.InTx(ctx, func(tx store.Tx) error {
		// The transaction may run again: it writes a copy of a as read.
		written, why := proto.CloneOf(a), reason
		dropped = nil
		local := written.GetStatus().GetLocalCheckpoint()
		st := written.Status
		st.LocalCheckpoint, st.LatestSnapshot, st.CrashReason, st.AcceptedStateLoss = "", target.GetMetadata().GetName(), "", nil
		var localSnap *torporv1.Snapshot
		if local != "" {
			var err error
			if localSnap, err = deleteLetGoInTx(ctx, tx, written, space, local); err != nil {
				return err
			}
			why += "; local checkpoint " + local + " dropped"
		}
		if from != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
			if err := e.setState(written, torporv1.ActorState_ACTOR_STATE_SUSPENDED); err != nil {
				return err
			}
		}
		if _, err := tx.Actors().Update(ctx, written); err != nil {
			return err
		}
		var err error
		if dropped, err = expireInTx(ctx, tx, newer); err != nil {
			return err
		}
		if localSnap != nil {
			dropped = append(dropped, localSnap)
		}
		return e.record(ctx, tx, a.GetMetadata().GetUid(), transition{from: from, to: torporv1.ActorState_ACTOR_STATE_SUSPENDED, reason: why})
	})
	if errors.Is(err, store.ErrConflict) {
		return errRetry
	}
	if err != nil {
		return fmt.Errorf("revert actor %s: %w", actorKey(a), err)
	}
	e.removeDropped(ctx, a, dropped)
	return nil
}

func revertReason(target *torporv1.Snapshot, newer []*torporv1.Snapshot) string {
	reason := "revert to snapshot " + target.GetMetadata().GetName()
	if len(newer) > 0 {
		reason += fmt.Sprintf("; %d newer snapshots discarded", len(newer))
	}
	return reason
}

// removeDropped removes the files of snapshots a revert deleted.
func (e *Engine) removeDropped(ctx context.Context, a *torporv1.Actor, dropped []*torporv1.Snapshot) {
	for _, s := range dropped {
		if err := e.removeSnapshotFiles(ctx, s); err != nil {
			e.logger(a).Warn("remove snapshot discarded by a revert", "snapshot", s.GetMetadata().GetName(), "err", err)
		}
	}
}

// claimDiscard commits the intent to stop a's running workload without a
// checkpoint and leave it SUSPENDED at target.
func (e *Engine) claimDiscard(ctx context.Context, a *torporv1.Actor, target *torporv1.Snapshot) (*torporv1.Actor, error) {
	op := &torporv1.ActorOperation{
		Id:             newOperationID(),
		Kind:           torporv1.OperationKind_OPERATION_KIND_REVERT,
		StartTime:      timestamppb.New(e.now()),
		TargetSnapshot: target.GetMetadata().GetName(),
		PreviousState:  torporv1.ActorState_ACTOR_STATE_RUNNING,
	}
	return e.commitIntent(ctx, a, op, torporv1.ActorState_ACTOR_STATE_SUSPENDING,
		"revert to snapshot "+op.GetTargetSnapshot()+" requested: the running workload is stopped without a checkpoint")
}

// driveDiscard stops the workload of a committed revert intent and leaves
// the actor SUSPENDED at the operation's target snapshot; Recover
// re-drives it the same way (Terminate is idempotent).
func (e *Engine) driveDiscard(ctx context.Context, a *torporv1.Actor) (*torporv1.Actor, error) {
	st, op := a.GetStatus(), a.GetStatus().GetOperation()
	moved, err := e.untilNodeAnswers(ctx, a, func(ctx context.Context) error {
		agent, err := e.agents.Agent(ctx, st.GetWorker().GetNode())
		if err != nil {
			return err
		}
		_, err = agent.Terminate(ctx, connect.NewRequest(&torporv1.TerminateRequest{
			Op: &torporv1.Operation{ActorUid: a.GetMetadata().GetUid(), OperationId: op.GetId(), Worker: st.GetWorker().GetName()},
		}))
		return err
	})
	switch {
	case moved != nil:
		return nil, errdefs.Errorf(errdefs.ErrAborted, "actor %s became %s while reverting: %s", actorKey(a), enum.Name(moved.GetStatus().GetState()), moved.GetStatus().GetCrashReason())
	case err == nil:
	case stillInFlight(ctx, err):
		return nil, err
	default:
		// The workload's fate is unknown: crashed, it resumes from its
		// latest snapshot, and the revert can be asked for again.
		e.logger(a).Warn("revert: stopping the workload failed", "err", err)
		if ierr := e.inSameStep(ctx, a, func(tx store.Tx, cur *torporv1.Actor) error {
			return e.crashInTx(ctx, tx, cur, "revert failed: "+connectMessage(err))
		}); ierr != nil {
			e.logger(a).Error("record failed revert", "err", ierr)
		}
		return nil, err
	}
	target, err := e.store.Snapshots().Get(ctx, a.GetMetadata().GetSpace(), op.GetTargetSnapshot())
	if err != nil {
		return nil, fmt.Errorf("revert actor %s: snapshot %s: %w", actorKey(a), op.GetTargetSnapshot(), err)
	}
	newer, err := e.newerSnapshots(ctx, a, target)
	if err != nil {
		return nil, err
	}
	reason := revertReason(target, newer) + ": the running workload was stopped"
	finish := func(cur *torporv1.Actor) (*torporv1.WorkerRef, error) {
		worker := cur.Status.Worker
		cur.Status.Worker, cur.Status.Operation = nil, nil
		cur.Status.LatestSnapshot, cur.Status.AcceptedStateLoss = op.GetTargetSnapshot(), nil
		return worker, e.setState(cur, torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	}
	suspendedAt := func(cur *torporv1.Actor) bool {
		return cur.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_SUSPENDED && cur.GetStatus().GetLatestSnapshot() == op.GetTargetSnapshot()
	}
	var out, lost *torporv1.Actor
	var dropped []*torporv1.Snapshot
	err = e.endStep(ctx, e.logger(a), func() error {
		return e.store.InTx(ctx, func(tx store.Tx) error {
			out, lost, dropped = nil, nil, nil
			end, err := endClaimedStep(ctx, tx, a, finish, suspendedAt)
			if err != nil || end.written == nil {
				out, lost = end.done, end.lost
				return err
			}
			out = end.written
			if err := releaseWorker(ctx, tx, end.result, out.GetMetadata().GetUid()); err != nil {
				return err
			}
			if dropped, err = expireInTx(ctx, tx, newer); err != nil {
				return err
			}
			return e.record(ctx, tx, out.GetMetadata().GetUid(), transition{
				from: torporv1.ActorState_ACTOR_STATE_SUSPENDING, to: torporv1.ActorState_ACTOR_STATE_SUSPENDED, op: op, worker: end.result,
				since: op.GetStartTime().AsTime(), reason: reason,
			})
		})
	})
	if err != nil {
		return nil, fmt.Errorf("finalize revert of actor %s: %w", actorKey(a), err)
	}
	if lost != nil {
		return nil, errdefs.Errorf(errdefs.ErrAborted, "actor %s became %s while reverting: %s", actorKey(a), enum.Name(lost.GetStatus().GetState()), lost.GetStatus().GetCrashReason())
	}
	e.removeDropped(ctx, a, dropped)
	return out, nil
}
