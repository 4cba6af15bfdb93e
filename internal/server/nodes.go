package server

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
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

// checkNodeReport checks what every report of a node on a workload
// names: the node, which must be the caller, the worker and the actor.
func checkNodeReport(ctx context.Context, node, worker, actorUID string) error {
	if err := validate.Name("node", node); err != nil {
		return err
	}
	if err := callerIs(ctx, node); err != nil {
		return err
	}
	switch {
	case worker == "":
		return invalidArgument("worker", "required")
	case actorUID == "":
		return invalidArgument("actor_uid", "required")
	}
	return nil
}

// ReportExit records that a workload on one of the caller's workers
// exited (Engine.ReportExit).
func (s *nodeService) ReportExit(ctx context.Context, req *connect.Request[torporv1.ReportExitRequest]) (*connect.Response[torporv1.ReportExitResponse], error) {
	m := req.Msg
	if err := checkNodeReport(ctx, m.GetNode(), m.GetWorker(), m.GetActorUid()); err != nil {
		return nil, err
	}
	switch {
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
	mem := workflow.HostMemory{Available: req.Msg.GetMemoryAvailableBytes(), Total: req.Msg.GetMemoryTotalBytes()}
	switch {
	case mem.Available < 0:
		return nil, invalidArgument("memoryAvailableBytes", "%d is negative", mem.Available)
	case mem.Available > mem.Total:
		return nil, invalidArgument("memoryAvailableBytes", "%d is more than memoryTotalBytes (%d)", mem.Available, mem.Total)
	}
	at, err := s.engine.Heartbeat(ctx, name, mem)
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

// ReportEgressDenied records the sampled egress refusals of a workload on
// one of the caller's workers in its actor's events
// (Engine.ReportEgressDenied). A report names at most
// workflow.MaxEgressSamples samples; one with more is refused whole
// (InvalidArgument), so no report writes unbounded events.
func (s *nodeService) ReportEgressDenied(ctx context.Context, req *connect.Request[torporv1.ReportEgressDeniedRequest]) (*connect.Response[torporv1.ReportEgressDeniedResponse], error) {
	m := req.Msg
	if err := checkNodeReport(ctx, m.GetNode(), m.GetWorker(), m.GetActorUid()); err != nil {
		return nil, err
	}
	switch {
	case m.GetCount() < int64(len(m.GetSamples())):
		return nil, invalidArgument("count", "%d is less than the %d samples", m.GetCount(), len(m.GetSamples()))
	case len(m.GetSamples()) > workflow.MaxEgressSamples:
		return nil, invalidArgument("samples", "%d samples, at most %d per report", len(m.GetSamples()), workflow.MaxEgressSamples)
	}
	for i, d := range m.GetSamples() {
		if err := egressDenial(d, fmt.Sprintf("samples[%d]", i)); err != nil {
			return nil, err
		}
	}
	if err := s.engine.ReportEgressDenied(ctx, m.GetNode(), m.GetWorker(), m.GetActorUid(), m.GetOperationId(), m.GetCount(), m.GetSamples()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ReportEgressDeniedResponse{}), nil
}

// egressDenial checks one sampled refusal at path.
func egressDenial(d *torporv1.EgressDenial, path string) error {
	switch p := d.GetProtocol(); {
	case p != "tcp" && p != "udp" && p != "icmp" && p != "dns":
		return invalidArgument(path+".protocol", "%q: want tcp, udp, icmp or dns", p)
	case d.GetDestination() == "" || len(d.GetDestination()) > 253 || strings.IndexFunc(d.GetDestination(), func(r rune) bool { return r <= ' ' || r > '~' }) >= 0:
		return invalidArgument(path+".destination", "must be an address or name of 1 to 253 printable bytes")
	case d.GetPort() < 0 || d.GetPort() > 65535:
		return invalidArgument(path+".port", "%d is not a port", d.GetPort())
	case d.GetTime() == nil:
		return invalidArgument(path+".time", "required")
	}
	return nil
}

// ReportFrozen records that a workload on one of the caller's workers was
// frozen or thawed (Engine.ReportFrozen).
func (s *nodeService) ReportFrozen(ctx context.Context, req *connect.Request[torporv1.ReportFrozenRequest]) (*connect.Response[torporv1.ReportFrozenResponse], error) {
	m := req.Msg
	if err := checkNodeReport(ctx, m.GetNode(), m.GetWorker(), m.GetActorUid()); err != nil {
		return nil, err
	}
	if m.GetTime() == nil {
		return nil, invalidArgument("time", "required")
	}
	if err := s.engine.ReportFrozen(ctx, m.GetNode(), m.GetWorker(), m.GetActorUid(), m.GetOperationId(), m.GetFrozen(), m.GetTime().AsTime()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ReportFrozenResponse{}), nil
}
