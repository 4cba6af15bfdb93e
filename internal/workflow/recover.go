package workflow

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	var (
		mu       sync.Mutex
		errs     []error
		redrives sync.WaitGroup
	)
	for _, state := range inFlightStates {
		actors, err := store.ListAll(ctx, e.store.Actors(), store.ListOptions{Filter: store.Filter{"state": state.String()}})
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			continue
		}
		for _, a := range actors {
			op := a.GetStatus().GetOperation()
			if op != nil && e.now().Sub(op.GetStartTime().AsTime()) < olderThan {
				continue
			}
			// Steps are re-driven side by side: one whose node is
			// unreachable waits for it without holding up the others.
			redrives.Go(func() {
				err := e.redrive(ctx, a)
				mu.Lock()
				defer mu.Unlock()
				errs = append(errs, err)
			})
		}
	}
	redrives.Wait()
	return errors.Join(errs...)
}

// redrive drives a's step unless this engine drives it already.
func (e *Engine) redrive(ctx context.Context, a *torporv1.Actor) error {
	op := a.GetStatus().GetOperation().GetId()
	if !e.driving.start(op) {
		return nil
	}
	defer e.driving.done(op)
	e.logger(a).Info("recovering step in flight")
	var err error
	switch a.GetStatus().GetState() {
	case torporv1.ActorState_ACTOR_STATE_RESUMING:
		_, err = e.driveResume(ctx, a, nil)
	case torporv1.ActorState_ACTOR_STATE_SUSPENDING, torporv1.ActorState_ACTOR_STATE_PAUSING:
		if a.GetStatus().GetOperation().GetKind() == torporv1.OperationKind_OPERATION_KIND_REVERT {
			_, err = e.driveDiscard(ctx, a)
			break
		}
		_, err = e.driveCheckpoint(ctx, a)
	case torporv1.ActorState_ACTOR_STATE_DELETING:
		err = e.driveDelete(ctx, a)
	}
	if err != nil {
		return fmt.Errorf("recover %s of actor %s: %w", a.GetStatus().GetOperation().GetKind(), actorKey(a), err)
	}
	return nil
}
