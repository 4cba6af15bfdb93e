package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// Recover finishes or rolls back every step in flight whose intent is at
// least olderThan old, by re-driving it with the same operation id: node
// calls are idempotent on it, and each finalizer is a compare-and-set, so a
// step another replica is still driving is not harmed. A starting server
// calls it with 0; the periodic sweep with Options.RecoverAfter.
func (e *Engine) Recover(ctx context.Context, olderThan time.Duration) error {
	var errs []error
	for _, state := range []torporv1.ActorState{
		torporv1.ActorState_ACTOR_STATE_RESUMING,
		torporv1.ActorState_ACTOR_STATE_SUSPENDING,
		torporv1.ActorState_ACTOR_STATE_PAUSING,
		torporv1.ActorState_ACTOR_STATE_DELETING,
	} {
		actors, err := listAll(ctx, e.store.Actors(), store.ListOptions{Filter: store.Filter{"state": state.String()}})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, a := range actors {
			op := a.GetStatus().GetOperation()
			if op != nil && e.now().Sub(op.GetStartTime().AsTime()) < olderThan {
				continue
			}
			e.logger(a).Info("recovering step in flight")
			errs = append(errs, e.redrive(ctx, a))
		}
	}
	return errors.Join(errs...)
}

func (e *Engine) redrive(ctx context.Context, a *torporv1.Actor) error {
	var err error
	switch a.GetStatus().GetState() {
	case torporv1.ActorState_ACTOR_STATE_RESUMING:
		_, err = e.driveResume(ctx, a, nil)
	case torporv1.ActorState_ACTOR_STATE_SUSPENDING, torporv1.ActorState_ACTOR_STATE_PAUSING:
		_, err = e.driveCheckpoint(ctx, a)
	case torporv1.ActorState_ACTOR_STATE_DELETING:
		err = e.driveDelete(ctx, a)
	}
	if err != nil {
		return fmt.Errorf("recover %s of actor %s: %w", a.GetStatus().GetOperation().GetKind(), actorKey(a), err)
	}
	return nil
}
