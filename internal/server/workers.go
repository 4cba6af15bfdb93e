package server

import (
	"context"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
	"github.com/torpor-dev/torpor/internal/workflow"
)

type workerService struct {
	store  store.Store
	engine *workflow.Engine
}

func (s *workerService) CreateWorker(ctx context.Context, req *connect.Request[torporv1.CreateWorkerRequest]) (*connect.Response[torporv1.Worker], error) {
	w := req.Msg.GetWorker()
	if w == nil {
		return nil, invalidArgument("worker", "required")
	}
	if err := validate.Worker(w); err != nil {
		return nil, err
	}
	created, err := s.store.Workers().Create(ctx, &torporv1.Worker{
		Metadata: userMeta(w.GetMetadata()),
		Spec:     w.GetSpec(),
		Status:   &torporv1.WorkerStatus{},
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(created), nil
}

func (s *workerService) GetWorker(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Worker], error) {
	w, err := get(ctx, s.store.Workers(), req.Msg, true)
	if err != nil {
		return nil, err
	}
	if err := withActivity(ctx, s.store, s.engine, []*torporv1.Worker{w}); err != nil {
		return nil, err
	}
	return connect.NewResponse(w), nil
}

func (s *workerService) ListWorkers(ctx context.Context, req *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListWorkersResponse], error) {
	items, next, err := list(ctx, s.store.Workers(), req.Msg)
	if err != nil {
		return nil, err
	}
	if err := withActivity(ctx, s.store, s.engine, items); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ListWorkersResponse{Workers: items, NextPageToken: next}), nil
}

// DeleteWorker refuses to remove a worker that hosts an actor
// (Engine.DeleteWorker).
func (s *workerService) DeleteWorker(ctx context.Context, req *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	m := req.Msg
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return nil, err
	}
	if err := s.engine.DeleteWorker(ctx, m.GetSpace(), m.GetName(), m.GetUid(), m.GetVersion()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.DeleteResponse{}), nil
}
