package server

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/kube"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// On Kubernetes (Options.Kubernetes) the control plane admits members by
// their pods' ServiceAccount tokens, lets only the cluster's Nodes
// register as nodes, applies their cordons, drains and deletions, removes
// the router clients of deleted pods and publishes its CA for members to
// mount.

// podClientSweepInterval is how often clients that joined as pods are
// checked against their pods: a deleted pod's certificate stops working
// within about this long.
const podClientSweepInterval = 10 * time.Second

// RunKubernetes keeps the control plane in step with its cluster
// (Options.Kubernetes) until ctx ends.
func (s *Server) RunKubernetes(ctx context.Context) error {
	k := s.opts.Kubernetes
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		// At once, so members that mount it can start; then again in
		// case someone removed it.
		if err := s.publishCA(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("publish the CA in Kubernetes", "err", err)
		}
		s.every(ctx, 10*time.Second, "publish the CA in Kubernetes", s.publishCA)
	})
	wg.Go(func() { s.every(ctx, podClientSweepInterval, "remove clients of deleted pods", s.sweepPodClients) })
	return k.RunNodeLifecycle(ctx, kubeNodes{store: s.store, engine: s.engine}, s.log.With("part", "kubernetes"))
}

func (s *Server) publishCA(ctx context.Context) error {
	a, err := s.Authority(ctx)
	if err != nil {
		return err
	}
	return s.opts.Kubernetes.PublishCA(ctx, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.CACertificate().Raw}))
}

// sweepPodClients deletes the clients whose pod is gone, so a deleted
// router pod's certificate stops working.
func (s *Server) sweepPodClients(ctx context.Context) error {
	a, err := s.Authority(ctx)
	if err != nil {
		return err
	}
	clients, err := a.ListClients(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range clients {
		if c.Pod == "" {
			continue
		}
		exists, err := s.opts.Kubernetes.PodExists(ctx, c.Pod)
		if err != nil || exists {
			errs = append(errs, err)
			continue
		}
		if err := a.DeleteClient(ctx, c.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		s.log.Info("removed the client of a deleted pod", "client", c.Name, "pod", c.Pod)
	}
	return errors.Join(errs...)
}

// kubeNodes is the engine's node lifecycle as the Kubernetes reconciler
// drives it.
type kubeNodes struct {
	store  store.Store
	engine *workflow.Engine
}

func (k kubeNodes) Nodes(ctx context.Context) ([]string, error) {
	nodes, err := store.ListAll(ctx, k.store.Nodes(), store.ListOptions{})
	if err != nil {
		return nil, err
	}
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.GetMetadata().GetName()
	}
	return names, nil
}

func (k kubeNodes) SetState(ctx context.Context, node string, s kube.NodeState) error {
	err := k.engine.SetCordon(ctx, node, workflow.Cordon{Cordoned: s.Cordoned, Draining: s.Draining, Reason: s.Reason})
	if errors.Is(err, store.ErrNotFound) {
		return nil // forgotten meanwhile
	}
	return err
}

func (k kubeNodes) Drain(ctx context.Context, node string) error { return k.engine.Drain(ctx, node) }

func (k kubeNodes) Forget(ctx context.Context, node, reason string) error {
	return k.engine.ForgetNode(ctx, node, reason)
}

// joinByKubernetes admits the caller of a Join with a Kubernetes token:
// a node agent's pod as its Node, a router's pod as a router client of
// the pod's name.
func (i *identityService) joinByKubernetes(ctx context.Context, a *identity.Authority, req *torporv1.JoinRequest) (*identity.Issued, error) {
	if i.kube == nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("this control plane does not verify Kubernetes tokens (torpor server --kubernetes): join with a join token"))
	}
	m, err := i.kube.VerifyMember(ctx, req.GetKubernetesToken())
	if errors.Is(err, kube.ErrRefused) {
		i.log.WarnContext(ctx, "join refused", "member", req.GetName(), "reason", err)
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	if err != nil {
		return nil, err
	}
	switch m.Kind {
	case kube.MemberNode:
		if req.GetName() != m.Name {
			return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("pod %s runs on Kubernetes Node %s: a node agent joins as its Node, not as %q", m.Pod, m.Name, req.GetName()))
		}
		return a.IssueNodeCertificate(m.Name, req.GetCsr())
	default:
		if req.GetName() != m.Name {
			return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("pod %s is a router: it joins as its pod's name %s, not as %q", m.Pod, m.Name, req.GetName()))
		}
		return a.JoinPodClient(ctx, m.Name, identity.RoleRouter, m.Pod, req.GetCsr())
	}
}
