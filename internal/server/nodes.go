package server

import (
	"context"
	"fmt"
	"net/url"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/kube"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
	"github.com/torpor-dev/torpor/internal/workflow"
)

type nodeService struct {
	store  store.Store
	engine *workflow.Engine
	// kube, on Kubernetes, says which Nodes exist: only they register.
	kube *kube.Cluster
}

// RegisterNode records a node and its workers (Engine.RegisterNode). It is
// idempotent: a restarted agent keeps its workers' uids and placements;
// workers it no longer reports are removed, crashing the actor one hosted.
func (s *nodeService) RegisterNode(ctx context.Context, req *connect.Request[torporv1.RegisterNodeRequest]) (*connect.Response[torporv1.RegisterNodeResponse], error) {
	n := req.Msg.GetNode()
	if err := validate.Name("node.metadata.name", n.GetMetadata().GetName()); err != nil {
		return nil, err
	}
	name := n.GetMetadata().GetName()
	if err := callerIs(ctx, name); err != nil {
		return nil, err
	}
	if u, err := url.Parse(n.GetAddress()); n.GetAddress() == "" || err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, invalidArgument("node.address", "%q is not an https URL (node agents serve over TLS)", n.GetAddress())
	}
	for i, w := range req.Msg.GetWorkers() {
		if err := validate.Worker(w); err != nil {
			return nil, fmt.Errorf("workers[%d]: %w", i, err)
		}
		if w.GetSpec().GetNode() != name {
			return nil, invalidArgument(fmt.Sprintf("workers[%d].spec.node", i), "%q is not the registering node %q", w.GetSpec().GetNode(), name)
		}
	}
	if s.kube != nil {
		exists, err := s.kube.NodeExists(ctx, name)
		if err != nil {
			return nil, err
		}
		if !exists {
			return nil, failedPrecondition("node %s: the cluster has no Kubernetes Node of that name (a node agent registers as the Node its pod runs on)", name)
		}
	}
	node, workers, err := s.engine.RegisterNode(ctx, n, req.Msg.GetWorkers())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.RegisterNodeResponse{Node: node, Workers: workers}), nil
}

// callerIs lets a node act only for itself: the caller's certificate
// must name node.
func callerIs(ctx context.Context, node string) error {
	caller, ok := identity.CallerNode(ctx)
	if !ok {
		return errNoNodeCertificate()
	}
	if caller != node {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("node %s may not act for node %s", caller, node))
	}
	return nil
}

// ReportExit records that a workload on one of the caller's workers
// exited (Engine.ReportExit).
func (s *nodeService) ReportExit(ctx context.Context, req *connect.Request[torporv1.ReportExitRequest]) (*connect.Response[torporv1.ReportExitResponse], error) {
	m := req.Msg
	if err := validate.Name("node", m.GetNode()); err != nil {
		return nil, err
	}
	if err := callerIs(ctx, m.GetNode()); err != nil {
		return nil, err
	}
	switch {
	case m.GetWorker() == "":
		return nil, invalidArgument("worker", "required")
	case m.GetActorUid() == "":
		return nil, invalidArgument("actor_uid", "required")
	case m.GetExit().GetContainer() == "":
		return nil, invalidArgument("exit.container", "required")
	}
	if err := s.engine.ReportExit(ctx, m.GetNode(), m.GetWorker(), m.GetActorUid(), m.GetOperationId(), m.GetExit()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ReportExitResponse{}), nil
}

// Heartbeat keeps a node alive (Engine.Heartbeat); a lost node is told to
// register again.
func (s *nodeService) Heartbeat(ctx context.Context, req *connect.Request[torporv1.HeartbeatRequest]) (*connect.Response[torporv1.HeartbeatResponse], error) {
	name := req.Msg.GetNode()
	if err := validate.Name("node", name); err != nil {
		return nil, err
	}
	if err := callerIs(ctx, name); err != nil {
		return nil, err
	}
	at, err := s.engine.Heartbeat(ctx, name)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.HeartbeatResponse{HeartbeatTime: at}), nil
}

func (s *nodeService) GetNode(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Node], error) {
	n, err := get(ctx, s.store.Nodes(), req.Msg, false)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(n), nil
}

func (s *nodeService) ListNodes(ctx context.Context, req *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListNodesResponse], error) {
	items, next, err := list(ctx, s.store.Nodes(), &torporv1.ListRequest{PageSize: req.Msg.GetPageSize(), PageToken: req.Msg.GetPageToken()})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ListNodesResponse{Nodes: items, NextPageToken: next}), nil
}

// ReportEgressDenied is being built (issue #28: egress refusals in the actor's events).
func (s *nodeService) ReportEgressDenied(ctx context.Context, req *connect.Request[torporv1.ReportEgressDeniedRequest]) (*connect.Response[torporv1.ReportEgressDeniedResponse], error) {
	return nil, fmt.Errorf("report egress denied for actor %s: %w", req.Msg.GetActorUid(), errdefs.ErrUnimplemented)
}
