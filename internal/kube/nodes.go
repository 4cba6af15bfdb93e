package kube

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// DrainTaint is the taint (any value and effect) that drains a Node: its
// actors are suspended to snapshot storage and resume on other nodes.
// kubectl drain leaves DaemonSet pods, the node agents, where they are,
// so a drain of Torpor's actors is asked for with this taint (see
// docs/deploy.md).
const DrainTaint = "torpor.dev/drain"

// NodeState is what a Kubernetes Node says of its Torpor node.
type NodeState struct {
	Cordoned, Draining bool
	Reason             string
}

// NodeLifecycle is the control plane's node lifecycle, which the
// cluster's Nodes drive.
type NodeLifecycle interface {
	// Nodes names the nodes registered with the control plane.
	Nodes(ctx context.Context) ([]string, error)
	// SetState records what the Node says (a cordon, a drain, neither).
	SetState(ctx context.Context, node string, s NodeState) error
	// Drain moves the actors of a draining node off it.
	Drain(ctx context.Context, node string) error
	// Forget removes a node whose Node is gone, crashing its actors at
	// once.
	Forget(ctx context.Context, node, reason string) error
}

// stateOf is what Node n asks of its Torpor node.
func stateOf(n *corev1.Node) NodeState {
	for _, t := range n.Spec.Taints {
		if t.Key == DrainTaint {
			return NodeState{Cordoned: true, Draining: true, Reason: fmt.Sprintf("Kubernetes Node %s has taint %s", n.Name, DrainTaint)}
		}
	}
	if n.Spec.Unschedulable {
		return NodeState{Cordoned: true, Reason: fmt.Sprintf("Kubernetes Node %s is cordoned", n.Name)}
	}
	return NodeState{}
}

// resyncInterval bounds how long a missed or failed change waits for the
// next reconcile.
const resyncInterval = 5 * time.Second

// RunNodeLifecycle keeps lc in step with the cluster's Nodes until ctx
// ends: a watch of the Nodes triggers a reconcile, and one runs every
// resyncInterval regardless. Every control-plane replica may run it: the
// lifecycle's steps are compare-and-set and idempotent. Drains run in the
// background, one per node at a time; it returns once they have ended.
func (c *Cluster) RunNodeLifecycle(ctx context.Context, lc NodeLifecycle, log *slog.Logger) error {
	factory := informers.NewSharedInformerFactory(c.client, 0)
	informer := factory.Core().V1().Nodes()
	poke := make(chan struct{}, 1)
	wake := func() {
		select {
		case poke <- struct{}{}:
		default:
		}
	}
	if _, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { wake() },
		UpdateFunc: func(any, any) { wake() },
		DeleteFunc: func(any) { wake() },
	}); err != nil {
		return fmt.Errorf("kubernetes: watch Nodes: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		return ctx.Err()
	}
	r := &reconciler{cluster: c, lc: lc, log: log, nodes: informer.Lister().List, draining: map[string]bool{}}
	defer r.drains.Wait()
	tick := time.NewTicker(resyncInterval)
	defer tick.Stop()
	for {
		if err := r.reconcile(ctx); err != nil && ctx.Err() == nil {
			log.Warn("reconcile Kubernetes Nodes", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-poke:
		case <-tick.C:
		}
	}
}

type reconciler struct {
	cluster *Cluster
	lc      NodeLifecycle
	log     *slog.Logger
	nodes   func(labels.Selector) ([]*corev1.Node, error)

	mu       sync.Mutex
	draining map[string]bool
	drains   sync.WaitGroup
}

// reconcile applies every Node's state to its Torpor node and forgets
// the Torpor nodes whose Node is gone (confirmed with the API server: the
// watch may lag behind a Node just created).
func (r *reconciler) reconcile(ctx context.Context) error {
	kubeNodes, err := r.nodes(labels.Everything())
	if err != nil {
		return err
	}
	byName := map[string]*corev1.Node{}
	for _, n := range kubeNodes {
		byName[n.Name] = n
	}
	names, err := r.lc.Nodes(ctx)
	if err != nil {
		return err
	}
	for _, name := range names {
		n, ok := byName[name]
		if !ok {
			if err := r.forgetIfGone(ctx, name); err != nil {
				r.log.Warn("forget node", "node", name, "err", err)
			}
			continue
		}
		s := stateOf(n)
		if err := r.lc.SetState(ctx, name, s); err != nil {
			r.log.Warn("apply Kubernetes Node state", "node", name, "err", err)
			continue
		}
		if s.Draining {
			r.drain(ctx, name)
		}
	}
	return nil
}

func (r *reconciler) forgetIfGone(ctx context.Context, name string) error {
	exists, err := r.cluster.NodeExists(ctx, name)
	if err != nil || exists {
		return err
	}
	return r.lc.Forget(ctx, name, fmt.Sprintf("Kubernetes Node %s was deleted", name))
}

// drain starts a drain of node unless one runs.
func (r *reconciler) drain(ctx context.Context, node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.draining[node] {
		return
	}
	r.draining[node] = true
	r.drains.Add(1)
	go func() {
		defer r.drains.Done()
		defer func() {
			r.mu.Lock()
			delete(r.draining, node)
			r.mu.Unlock()
		}()
		start := time.Now()
		if err := r.lc.Drain(ctx, node); err != nil {
			r.log.Warn("drain node", "node", node, "err", err)
			return
		}
		r.log.Info("node drained", "node", node, "took", time.Since(start).Round(time.Millisecond))
	}()
}
