package workflow

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// Delete removes an actor that holds no worker, with all its snapshots
// but those a tag keeps (untagging one of a deleted actor removes it).
// The DELETING intent is committed first, so a crash mid-way is finished by
// Recover.
func (e *Engine) Delete(ctx context.Context, space, name string) (err error) {
	start := e.now()
	defer func() { e.metrics.observe("delete", start, err) }()
	a, err := e.store.Actors().Get(ctx, space, name)
	if err != nil {
		return err
	}
	switch state := a.GetStatus().GetState(); state {
	case torporv1.ActorState_ACTOR_STATE_DELETING:
	case torporv1.ActorState_ACTOR_STATE_SUSPENDED, torporv1.ActorState_ACTOR_STATE_PAUSED, torporv1.ActorState_ACTOR_STATE_CRASHED:
		op := &torporv1.ActorOperation{Id: newOperationID(), Kind: torporv1.OperationKind_OPERATION_KIND_DELETE, StartTime: timestamppb.New(e.now()), PreviousState: state}
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
			return e.record(ctx, tx, claimed.GetMetadata().GetUid(), transition{from: state, to: torporv1.ActorState_ACTOR_STATE_DELETING, reason: "delete requested", op: op})
		})
		if errors.Is(err, store.ErrConflict) {
			return errdefs.Errorf(errdefs.ErrAborted, "actor %s changed while deleting: retry", actorKey(a))
		}
		if err != nil {
			return err
		}
		a = claimed
	default:
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s is %s: suspend it before deleting", actorKey(a), enum.Name(state))
	}
	return e.driveDelete(ctx, a)
}

func (e *Engine) driveDelete(ctx context.Context, a *torporv1.Actor) error {
	snaps, err := e.actorSnapshots(ctx, a)
	if err != nil {
		return err
	}
	for _, s := range snaps {
		if kept, err := tagged(ctx, e.store, s); err != nil || kept {
			if err != nil {
				return fmt.Errorf("delete actor %s: %w", actorKey(a), err)
			}
			continue
		}
		if err := e.removeSnapshot(ctx, s); err != nil {
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
