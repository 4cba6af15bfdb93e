package workflow

import (
	"context"
	"errors"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// Snapshot tags. A tag keeps its snapshot from every deletion
// (referencesOf, snapshots.go); tagging bumps the snapshot record's
// version in the tag's transaction, so a delete decided before the tag
// fails on its compare-and-set and the snapshot stays.

// Tag names snapshot (a durable snapshot of an actor in space) tag.
func (e *Engine) Tag(ctx context.Context, space, tag, snapshot string, scope torporv1.SnapshotTagScope) (*torporv1.SnapshotTag, error) {
	if scope == torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_UNSPECIFIED {
		scope = torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_SPACE
	}
	var out *torporv1.SnapshotTag
	err := e.store.InTx(ctx, func(tx store.Tx) error {
		snap, err := taggable(ctx, tx, space, snapshot)
		if err != nil {
			return err
		}
		if _, err := tx.Snapshots().Update(ctx, snap); err != nil {
			return err
		}
		out, err = tx.Tags().Create(ctx, &torporv1.SnapshotTag{
			Metadata: &torporv1.ObjectMeta{Space: space, Name: tag},
			Snapshot: snapshot, Actor: snap.GetActorName(), Scope: scope,
		})
		return err
	})
	if errors.Is(err, store.ErrConflict) {
		return nil, errdefs.Errorf(errdefs.ErrAborted, "snapshot %s/%s changed while tagging it: retry", space, snapshot)
	}
	return out, err
}

// taggable reads snapshot and checks that it can be tagged (and forked):
// an actor's snapshot in snapshot storage.
func taggable(ctx context.Context, tx store.Tx, space, snapshot string) (*torporv1.Snapshot, error) {
	snap, err := tx.Snapshots().Get(ctx, space, snapshot)
	if err != nil {
		return nil, err
	}
	switch {
	case snap.GetActorName() == "":
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "snapshot %s/%s is a template's golden snapshot, not an actor's", space, snapshot)
	case snap.GetNode() != "":
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "snapshot %s/%s is a local checkpoint on node %s: only snapshots in snapshot storage can be tagged or forked (suspend the actor to make one)", space, snapshot, snap.GetNode())
	}
	return snap, nil
}

// Untag removes tag (uid and version, when set, must match). A snapshot
// no tag keeps any longer is left to its actor's retention, or removed
// now if its actor is gone: nothing else would.
func (e *Engine) Untag(ctx context.Context, space, tag, uid string, version int64) error {
	var orphan *torporv1.Snapshot
	err := e.store.InTx(ctx, func(tx store.Tx) error {
		orphan = nil
		t, err := tx.Tags().Get(ctx, space, tag)
		if err != nil {
			return err
		}
		if err := tx.Tags().Delete(ctx, space, tag, uid, version); err != nil {
			return err
		}
		snap, err := tx.Snapshots().Get(ctx, space, t.GetSnapshot())
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		// A living actor's snapshot is left to its retention; one being
		// deleted lets go of its snapshots.
		var after *torporv1.Actor
		a, err := tx.Actors().Get(ctx, space, snap.GetActorName())
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return err
		case a.GetMetadata().GetUid() != snap.GetActorUid():
		case a.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_DELETING:
			return nil
		default:
			after = lettingGo(a)
		}
		holder, err := deleteUnheldInTx(ctx, tx, after, snap)
		if err == nil && holder == "" {
			orphan = snap
		}
		return err
	})
	if errors.Is(err, store.ErrConflict) {
		return errdefs.Errorf(errdefs.ErrAborted, "tag %s/%s or its snapshot changed while untagging: retry", space, tag)
	}
	if err != nil {
		return err
	}
	if orphan != nil {
		if err := e.removeSnapshotFiles(ctx, orphan); err != nil {
			e.log.Warn("remove untagged snapshot of a deleted actor", "snapshot", orphan.GetMetadata().GetName(), "space", space, "err", err)
		}
	}
	return nil
}
