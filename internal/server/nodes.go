package server

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
	"github.com/torpor-dev/torpor/internal/workflow"
)

type nodeService struct {
	store  store.Store
	engine *workflow.Engine
	// heartbeatTimeout: a node silent for longer was lost (see Heartbeat).
	heartbeatTimeout time.Duration
}

// RegisterNode records a node and its workers. It is idempotent: a
// restarted agent keeps its workers' uids and placements; workers it no
// longer reports are removed, crashing the actor one hosted.
func (s *nodeService) RegisterNode(ctx context.Context, req *connect.Request[torporv1.RegisterNodeRequest]) (*connect.Response[torporv1.RegisterNodeResponse], error) {
	n := req.Msg.GetNode()
	if err := validate.Name("node.metadata.name", n.GetMetadata().GetName()); err != nil {
		return nil, apiError(err)
	}
	name := n.GetMetadata().GetName()
	if err := callerIs(ctx, name); err != nil {
		return nil, err
	}
	if u, err := url.Parse(n.GetAddress()); n.GetAddress() == "" || err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, invalidArgument("node.address", "%q is not an https URL (node agents serve over TLS)", n.GetAddress())
	}
	reported := map[string]bool{}
	for i, w := range req.Msg.GetWorkers() {
		if err := validate.Worker(w); err != nil {
			return nil, apiError(fmt.Errorf("workers[%d]: %w", i, err))
		}
		if w.GetSpec().GetNode() != name {
			return nil, invalidArgument(fmt.Sprintf("workers[%d].spec.node", i), "%q is not the registering node %q", w.GetSpec().GetNode(), name)
		}
		reported[w.GetMetadata().GetSpace()+"/"+w.GetMetadata().GetName()] = true
	}
	node, err := s.upsertNode(ctx, n)
	if err != nil {
		return nil, apiError(err)
	}
	var workers []*torporv1.Worker
	for _, w := range req.Msg.GetWorkers() {
		stored, err := s.upsertWorker(ctx, w)
		if err != nil {
			return nil, apiError(err)
		}
		workers = append(workers, stored)
	}
	if err := s.removeUnreported(ctx, name, reported); err != nil {
		return nil, apiError(err)
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

func (s *nodeService) upsertNode(ctx context.Context, n *torporv1.Node) (*torporv1.Node, error) {
	name := n.GetMetadata().GetName()
	now := timestamppb.Now()
	for range 10 {
		cur, err := s.store.Nodes().Get(ctx, "", name)
		if errors.Is(err, store.ErrNotFound) {
			created, err := s.store.Nodes().Create(ctx, &torporv1.Node{
				Metadata: &torporv1.ObjectMeta{Name: name, Labels: n.GetMetadata().GetLabels()},
				Address:  n.GetAddress(), HeartbeatTime: now, SandboxClasses: n.GetSandboxClasses(),
			})
			if errors.Is(err, store.ErrAlreadyExists) {
				continue
			}
			return created, err
		}
		if err != nil {
			return nil, err
		}
		cur.Address, cur.HeartbeatTime, cur.SandboxClasses = n.GetAddress(), now, n.GetSandboxClasses()
		cur.Metadata.Labels = n.GetMetadata().GetLabels()
		updated, err := s.store.Nodes().Update(ctx, cur)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		return updated, err
	}
	return nil, fmt.Errorf("register node %s: too many concurrent changes", name)
}

func (s *nodeService) upsertWorker(ctx context.Context, w *torporv1.Worker) (*torporv1.Worker, error) {
	ns, name := w.GetMetadata().GetSpace(), w.GetMetadata().GetName()
	for range 10 {
		cur, err := s.store.Workers().Get(ctx, ns, name)
		if errors.Is(err, store.ErrNotFound) {
			created, err := s.store.Workers().Create(ctx, &torporv1.Worker{Metadata: userMeta(w.GetMetadata()), Spec: w.GetSpec(), Status: &torporv1.WorkerStatus{}})
			if errors.Is(err, store.ErrAlreadyExists) {
				continue
			}
			return created, err
		}
		if err != nil {
			return nil, err
		}
		if cur.GetSpec().GetNode() != w.GetSpec().GetNode() {
			return nil, failedPrecondition("worker %s/%s belongs to node %s", ns, name, cur.GetSpec().GetNode())
		}
		if proto.Equal(cur.GetSpec(), w.GetSpec()) && proto.Equal(&torporv1.ObjectMeta{Labels: cur.GetMetadata().GetLabels()}, &torporv1.ObjectMeta{Labels: w.GetMetadata().GetLabels()}) {
			return cur, nil
		}
		cur.Spec = w.GetSpec()
		cur.Metadata.Labels = w.GetMetadata().GetLabels()
		updated, err := s.store.Workers().Update(ctx, cur)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		return updated, err
	}
	return nil, fmt.Errorf("register worker %s/%s: too many concurrent changes", ns, name)
}

// removeUnreported deletes the node's workers it did not report: a worker
// that disappeared crashes the actor it hosted.
func (s *nodeService) removeUnreported(ctx context.Context, node string, reported map[string]bool) error {
	opts := store.ListOptions{Filter: store.Filter{"node": node}, PageSize: 1000}
	var gone []*torporv1.Worker
	for {
		page, next, err := s.store.Workers().List(ctx, opts)
		if err != nil {
			return err
		}
		for _, w := range page {
			if !reported[w.GetMetadata().GetSpace()+"/"+w.GetMetadata().GetName()] {
				gone = append(gone, w)
			}
		}
		if next == "" {
			break
		}
		opts.PageToken = next
	}
	for _, w := range gone {
		if w.GetStatus().GetActor().GetUid() != "" {
			if err := s.engine.CrashWorkerActor(ctx, w, fmt.Sprintf("worker %s disappeared from node %s", w.GetMetadata().GetName(), node)); err != nil {
				return err
			}
		}
		if err := s.store.Workers().Delete(ctx, w.GetMetadata().GetSpace(), w.GetMetadata().GetName(), w.GetMetadata().GetUid(), 0); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	return nil
}

func (s *nodeService) Heartbeat(ctx context.Context, req *connect.Request[torporv1.HeartbeatRequest]) (*connect.Response[torporv1.HeartbeatResponse], error) {
	name := req.Msg.GetNode()
	if err := validate.Name("node", name); err != nil {
		return nil, apiError(err)
	}
	if err := callerIs(ctx, name); err != nil {
		return nil, err
	}
	for range 10 {
		n, err := s.store.Nodes().Get(ctx, "", name)
		if err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("node %s is not registered: register it first", name))
			}
			return nil, apiError(err)
		}
		// A node silent for too long was lost: its actors may have crashed
		// and moved on. Registering again tells it which of its workloads
		// it still hosts (the agent registers again on NotFound).
		if last := n.GetHeartbeatTime(); last != nil && time.Since(last.AsTime()) > s.heartbeatTimeout {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("node %s was lost (last heartbeat %s): register again", name, last.AsTime().Format(time.RFC3339Nano)))
		}
		n.HeartbeatTime = timestamppb.New(time.Now())
		if _, err := s.store.Nodes().Update(ctx, n); errors.Is(err, store.ErrConflict) {
			continue
		} else if err != nil {
			return nil, apiError(err)
		}
		return connect.NewResponse(&torporv1.HeartbeatResponse{HeartbeatTime: n.HeartbeatTime}), nil
	}
	return nil, connect.NewError(connect.CodeAborted, fmt.Errorf("heartbeat of node %s: too many concurrent changes", name))
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
