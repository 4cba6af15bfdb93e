package server

import (
	"context"

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

// DeleteSnapshot refuses to remove a snapshot something holds: an
// actor's current state, a tag, a template's golden snapshot
// (Engine.DeleteSnapshot).
func (s *snapshotService) DeleteSnapshot(ctx context.Context, req *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	m := req.Msg
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return nil, err
	}
	if err := s.engine.DeleteSnapshot(ctx, m.GetSpace(), m.GetName(), m.GetUid(), m.GetVersion()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.DeleteResponse{}), nil
}
