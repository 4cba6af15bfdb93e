package workflow

import (
	"context"
	"errors"
	"fmt"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// A node's lifecycle as its cluster decides it (on Kubernetes: a Node
// cordoned, drained or deleted): cordoned nodes take no new actors
// (placeableIn), a drain moves the node's actors to snapshot storage, and a
// node that is gone for good has its actors crashed at once instead of
// after the heartbeat timeout.

// Cordon is what the cluster says of a node's placements.
type Cordon struct {
	// Cordoned: no new actor is placed on the node.
	Cordoned bool
	// Draining: the node's actors are to leave it (implies Cordoned).
	Draining bool
	// Reason says who cordoned it and how, for users.
	Reason string
}

// SetCordon records c on node's record. It is a no-op when the record
// already says so, and NotFound for a node that never registered.
func (e *Engine) SetCordon(ctx context.Context, node string, c Cordon) error {
	c.Cordoned = c.Cordoned || c.Draining
	if !c.Cordoned {
		c.Reason = ""
	}
	for range maxRegisterAttempts {
		n, err := e.store.Nodes().Get(ctx, "", node)
		if err != nil {
			return err
		}
		if n.GetCordoned() == c.Cordoned && n.GetDraining() == c.Draining && n.GetCordonReason() == c.Reason {
			return nil
		}
		n.Cordoned, n.Draining, n.CordonReason = c.Cordoned, c.Draining, c.Reason
		if _, err := e.store.Nodes().Update(ctx, n); errors.Is(err, store.ErrConflict) {
			continue
		} else if err != nil {
			return err
		}
		e.log.Info("node cordon changed", "node", node, "cordoned", c.Cordoned, "draining", c.Draining, "reason", c.Reason)
		return nil
	}
	return errdefs.Errorf(errdefs.ErrAborted, "cordon node %s: too many concurrent changes", node)
}

// Drain moves every actor off node, which must be draining (SetCordon):
// running actors are suspended to snapshot storage, and paused ones, whose
// newest state is a local checkpoint on the node, are resumed there and
// suspended, so every one of them can resume on another node with its
// state. Steps in flight are waited for. It returns once no actor holds a
// worker or a local checkpoint on the node, or with the errors of the
// actors it could not move (the next call tries them again).
func (e *Engine) Drain(ctx context.Context, node string) error {
	n, err := e.store.Nodes().Get(ctx, "", node)
	if err != nil {
		return err
	}
	if !n.GetDraining() {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "node %s is not draining", node)
	}
	actors, err := e.actorsOn(ctx, node)
	if err != nil {
		return err
	}
	var errs []error
	for _, a := range actors {
		if err := e.drainActor(ctx, node, a); err != nil {
			errs = append(errs, fmt.Errorf("drain node %s: actor %s: %w", node, actorKey(a), err))
		}
	}
	return errors.Join(errs...)
}

// actorsOn lists the actors on node: those on its workers and those whose
// local checkpoint it holds.
func (e *Engine) actorsOn(ctx context.Context, node string) ([]*torporv1.Actor, error) {
	workers, err := store.ListAll(ctx, e.store.Workers(), store.ListOptions{Filter: store.Filter{"node": node}})
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var actors []*torporv1.Actor
	add := func(space, name string) error {
		if seen[space+"/"+name] {
			return nil
		}
		seen[space+"/"+name] = true
		a, err := e.store.Actors().Get(ctx, space, name)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err == nil {
			actors = append(actors, a)
		}
		return err
	}
	for _, w := range workers {
		if ref := w.GetStatus().GetActor(); ref.GetUid() != "" {
			if err := add(ref.GetSpace(), ref.GetName()); err != nil {
				return nil, err
			}
		}
	}
	paused, err := store.ListAll(ctx, e.store.Actors(), store.ListOptions{Filter: store.Filter{"state": enum.Name(torporv1.ActorState_ACTOR_STATE_PAUSED)}})
	if err != nil {
		return nil, err
	}
	for _, a := range paused {
		local := a.GetStatus().GetLocalCheckpoint()
		if local == "" {
			continue
		}
		snap, err := e.store.Snapshots().Get(ctx, a.GetMetadata().GetSpace(), local)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if snap.GetNode() == node {
			if err := add(a.GetMetadata().GetSpace(), a.GetMetadata().GetName()); err != nil {
				return nil, err
			}
		}
	}
	return actors, nil
}

// drainActor suspends a, listed on node, to snapshot storage, resuming it
// first where it is paused. A step in flight is waited for; an actor that
// ended up suspended, crashed, deleted or running on another node
// meanwhile needs nothing more. (Every control-plane replica drains: a
// list one made before another's drain finished names actors that may
// have been resumed elsewhere since, by their traffic.)
func (e *Engine) drainActor(ctx context.Context, node string, a *torporv1.Actor) error {
	space, name := a.GetMetadata().GetSpace(), a.GetMetadata().GetName()
	if a.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_PAUSED {
		if _, err := e.Resume(ctx, space, name, ResumeOptions{}); err != nil {
			return fmt.Errorf("resume to move its local checkpoint: %w", err)
		}
	}
	_, err := e.checkpoint(ctx, space, name, suspendKind, node)
	if errors.Is(err, errdefs.ErrFailedPrecondition) || errors.Is(err, store.ErrNotFound) {
		cur, gerr := e.store.Actors().Get(ctx, space, name)
		if errors.Is(gerr, store.ErrNotFound) || gerr == nil && !holdsWorker(cur.GetStatus().GetState()) && cur.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_PAUSED {
			return nil
		}
	}
	return err
}

// ForgetNode removes node, gone from its cluster for good (a deleted
// Kubernetes Node): the actors on its workers are crashed at once with
// reason, each keeping its latest durable snapshot to resume from
// elsewhere, and its worker and node records are deleted. A paused
// actor's local checkpoint there is lost with the node; its next resume
// says so and starts from its latest durable snapshot.
func (e *Engine) ForgetNode(ctx context.Context, node, reason string) error {
	workers, err := store.ListAll(ctx, e.store.Workers(), store.ListOptions{Filter: store.Filter{"node": node}})
	if err != nil {
		return err
	}
	if err := e.RemoveWorkers(ctx, workers, "is gone: "+reason); err != nil {
		return err
	}
	n, err := e.store.Nodes().Get(ctx, "", node)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := e.store.Nodes().Delete(ctx, "", node, n.GetMetadata().GetUid(), 0); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("forget node %s: %w", node, err)
	}
	e.log.Warn("node forgotten", "node", node, "reason", reason, "workers", len(workers))
	return nil
}
