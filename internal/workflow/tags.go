package workflow

import (
	"context"
	"errors"
	"fmt"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// Snapshot tags and shared snapshot files.
//
// A tag keeps its snapshot from retention; a fork's first snapshot record
// shares its source's files (same location). Whoever deletes a snapshot
// record checks first that no tag names it and compare-and-sets the
// record's version it read; whoever tags or forks a snapshot bumps that
// version in its own transaction. So a tag or a fork committed after the
// check makes the delete fail (and the snapshot stay) on either backend,
// and files are removed only once no record names their location.

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
		if kept, err := tagged(ctx, tx, snap); err != nil || kept {
			return err
		}
		a, err := tx.Actors().Get(ctx, space, snap.GetActorName())
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return err
		case a.GetMetadata().GetUid() == snap.GetActorUid() && a.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_DELETING:
			return nil
		}
		orphan = snap
		m := snap.GetMetadata()
		return tx.Snapshots().Delete(ctx, space, m.GetName(), m.GetUid(), m.GetVersion())
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

// tagged reports whether a tag names snap.
func tagged(ctx context.Context, tx store.Tx, snap *torporv1.Snapshot) (bool, error) {
	tags, _, err := tx.Tags().List(ctx, store.ListOptions{Space: snap.GetMetadata().GetSpace(), PageSize: 1, Filter: store.Filter{"snapshot": snap.GetMetadata().GetName()}})
	if err != nil {
		return false, fmt.Errorf("tags of snapshot %s/%s: %w", snap.GetMetadata().GetSpace(), snap.GetMetadata().GetName(), err)
	}
	return len(tags) > 0, nil
}

// untagged are the snapshots of snaps that no tag keeps.
func untagged(ctx context.Context, tx store.Tx, snaps []*torporv1.Snapshot) ([]*torporv1.Snapshot, error) {
	var out []*torporv1.Snapshot
	for _, s := range snaps {
		kept, err := tagged(ctx, tx, s)
		if err != nil {
			return nil, err
		}
		if !kept {
			out = append(out, s)
		}
	}
	return out, nil
}

// shared reports whether a record other than snap names snap's location:
// a fork's, or its source's.
func (e *Engine) shared(ctx context.Context, snap *torporv1.Snapshot) (bool, error) {
	others, _, err := e.store.Snapshots().List(ctx, store.ListOptions{PageSize: 2, Filter: store.Filter{"location": snap.GetLocation()}})
	if err != nil {
		return false, fmt.Errorf("records of snapshot location %s: %w", snap.GetLocation(), err)
	}
	for _, o := range others {
		if o.GetMetadata().GetUid() != snap.GetMetadata().GetUid() {
			return true, nil
		}
	}
	return false, nil
}
