package server

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/workflow"
)

type snapshotService struct {
	store  store.Store
	engine *workflow.Engine
}

func (s *snapshotService) GetSnapshot(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Snapshot], error) {
	snap, err := get(ctx, s.store.Snapshots(), req.Msg, true)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(snap), nil
}

func (s *snapshotService) ListSnapshots(ctx context.Context, req *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListSnapshotsResponse], error) {
	items, next, err := list(ctx, s.store.Snapshots(), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ListSnapshotsResponse{Snapshots: items, NextPageToken: next}), nil
}

// DeleteSnapshot refuses to remove a snapshot an actor still points at
// (the actor's state would be lost, invariant 5) or a tag keeps. It
// deletes the record as read, so a tag or fork committed meanwhile makes
// it fail. The files go with the orphan sweep, once no record (a fork's
// included) names them.
func (s *snapshotService) DeleteSnapshot(ctx context.Context, req *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	m := req.Msg
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return nil, err
	}
	err := s.store.InTx(ctx, func(tx store.Tx) error {
		snap, err := tx.Snapshots().Get(ctx, m.GetSpace(), m.GetName())
		if err != nil {
			return err
		}
		a, err := tx.Actors().Get(ctx, m.GetSpace(), snap.GetActorName())
		switch {
		case isNotFound(err):
		case err != nil:
			return err
		case a.GetMetadata().GetUid() == snap.GetActorUid() && pointsAt(a.GetStatus(), snap.GetMetadata().GetName()):
			return failedPrecondition("snapshot %s/%s is the current state of actor %s", m.GetSpace(), m.GetName(), a.GetMetadata().GetName())
		}
		tags, _, err := tx.Tags().List(ctx, store.ListOptions{Space: m.GetSpace(), PageSize: 1, Filter: store.Filter{"snapshot": m.GetName()}})
		if err != nil {
			return err
		}
		if len(tags) > 0 {
			return failedPrecondition("snapshot %s/%s is tagged %s: untag it first", m.GetSpace(), m.GetName(), tags[0].GetMetadata().GetName())
		}
		if (m.GetUid() != "" && m.GetUid() != snap.GetMetadata().GetUid()) || (m.GetVersion() != 0 && m.GetVersion() != snap.GetMetadata().GetVersion()) {
			return connect.NewError(connect.CodeAborted, fmt.Errorf("snapshot %s/%s does not match the given uid or version", m.GetSpace(), m.GetName()))
		}
		return tx.Snapshots().Delete(ctx, m.GetSpace(), m.GetName(), snap.GetMetadata().GetUid(), snap.GetMetadata().GetVersion())
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.DeleteResponse{}), nil
}

func pointsAt(st *torporv1.ActorStatus, snapshot string) bool {
	return st.GetLatestSnapshot() == snapshot || st.GetLocalCheckpoint() == snapshot
}
