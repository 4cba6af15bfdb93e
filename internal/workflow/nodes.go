package workflow

import (
	"context"
	"errors"
	"fmt"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// liveIn tells which of the nodes, as read, are alive.
func (e *Engine) liveIn(nodes []*torporv1.Node) func(string) bool {
	live := map[string]bool{}
	for _, n := range nodes {
		live[n.GetMetadata().GetName()] = e.alive(n)
	}
	return func(node string) bool { return live[node] }
}

// placeableNodes reads which nodes may take new actors, alive and not
// cordoned, from the store (never a cache: a decision must see what is
// committed, invariant 4).
func (e *Engine) placeableNodes(ctx context.Context) (func(string) bool, error) {
	nodes, err := store.ListAll(ctx, e.store.Nodes(), store.ListOptions{})
	if err != nil {
		return nil, err
	}
	return e.placeableIn(nodes, ""), nil
}

// placeableIn tells which of the nodes, as read, may take an actor: alive
// and not cordoned, except that the node holding the actor's local
// checkpoint (requireNode) takes it even cordoned, since its newest state
// is only there (a drain resumes paused actors there to suspend them).
func (e *Engine) placeableIn(nodes []*torporv1.Node, requireNode string) func(string) bool {
	ok := map[string]bool{}
	for _, n := range nodes {
		name := n.GetMetadata().GetName()
		ok[name] = e.alive(n) && (!n.GetCordoned() || name == requireNode)
	}
	return func(node string) bool { return ok[node] }
}

func (e *Engine) alive(n *torporv1.Node) bool {
	hb := n.GetHeartbeatTime()
	return hb != nil && e.now().Sub(hb.AsTime()) <= e.opts.HeartbeatTimeout
}

func (e *Engine) freeWorkers(ctx context.Context) ([]*torporv1.Worker, error) {
	return store.ListAll(ctx, e.store.Workers(), freeWorkerList)
}

// freeWorkerList lists the workers no actor holds.
var freeWorkerList = store.ListOptions{Filter: store.Filter{"actor": ""}}

// CheckNodes crashes the actors of nodes that stopped heartbeating: each
// becomes CRASHED with the reason and its worker is released.
func (e *Engine) CheckNodes(ctx context.Context) error {
	nodes, err := store.ListAll(ctx, e.store.Nodes(), store.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range nodes {
		if e.alive(n) {
			continue
		}
		workers, err := store.ListAll(ctx, e.store.Workers(), store.ListOptions{Filter: store.Filter{"node": n.GetMetadata().GetName()}})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, w := range workers {
			if w.GetStatus().GetActor().GetUid() == "" {
				continue
			}
			reason := fmt.Sprintf("node %s stopped heartbeating (last %s)", n.GetMetadata().GetName(), n.GetHeartbeatTime().AsTime().Format("15:04:05.000"))
			errs = append(errs, e.crashOnLostNode(ctx, n, w, reason))
		}
	}
	return errors.Join(errs...)
}

// crashOnLostNode crashes w's actor only if node n is still lost when the
// transaction commits: it compare-and-sets the node record, so a node that
// re-registers meanwhile (and reads its placements) either sees the crash or
// makes it abort — never a crash its registration missed.
func (e *Engine) crashOnLostNode(ctx context.Context, n *torporv1.Node, w *torporv1.Worker, reason string) error {
	err := e.store.InTx(ctx, func(tx store.Tx) error {
		cur, err := tx.Nodes().Get(ctx, "", n.GetMetadata().GetName())
		if err != nil {
			return err
		}
		if e.alive(cur) {
			return nil
		}
		if _, err := tx.Nodes().Update(ctx, cur); err != nil {
			return err
		}
		return e.crashInWorkerTx(ctx, tx, w, reason)
	})
	if errors.Is(err, store.ErrConflict) {
		return nil // the node came back; the next check decides again
	}
	return err
}

// CrashWorkerActor makes the actor hosted by w CRASHED with reason and frees
// w, in one transaction. Nothing happens if w and its actor no longer point
// at each other.
func (e *Engine) CrashWorkerActor(ctx context.Context, w *torporv1.Worker, reason string) error {
	return e.store.InTx(ctx, func(tx store.Tx) error { return e.crashInWorkerTx(ctx, tx, w, reason) })
}

func (e *Engine) crashInWorkerTx(ctx context.Context, tx store.Tx, w *torporv1.Worker, reason string) error {
	ref := w.GetStatus().GetActor()
	self := &torporv1.WorkerRef{Namespace: w.GetMetadata().GetSpace(), Name: w.GetMetadata().GetName()}
	a, err := tx.Actors().Get(ctx, ref.GetSpace(), ref.GetName())
	switch {
	case errors.Is(err, store.ErrNotFound):
		return releaseWorker(ctx, tx, self, ref.GetUid())
	case err != nil:
		return err
	case a.GetMetadata().GetUid() != ref.GetUid() || a.GetStatus().GetWorker().GetUid() != w.GetMetadata().GetUid():
		return releaseWorker(ctx, tx, self, ref.GetUid())
	}
	e.logger(a).Warn("actor crashed", "reason", reason)
	return e.crashInTx(ctx, tx, a, reason)
}
