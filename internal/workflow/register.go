package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// Node membership: a node agent registers its workers and then
// heartbeats. The engine is the one writer of node and worker records
// here, as of actors, so registration, the crashes it causes and the
// liveness check that crashes a lost node's actors (CheckNodes) decide
// against each other through the same compare-and-set records.

// maxRegisterAttempts bounds the compare-and-set retries of one
// registration or heartbeat against concurrent writers of the same record.
const maxRegisterAttempts = 10

// RegisterNode records node n and the workers its agent reports, and
// returns the stored records: a restarted agent keeps its workers' uids and
// placements, and learns from them which of its workloads the control
// plane still places on it. Workers of the node it no longer reports are
// removed (RemoveWorkers). The caller checked the request's shape and that
// the caller is the node.
func (e *Engine) RegisterNode(ctx context.Context, n *torporv1.Node, workers []*torporv1.Worker) (*torporv1.Node, []*torporv1.Worker, error) {
	name := n.GetMetadata().GetName()
	node, err := e.upsertNode(ctx, n)
	if err != nil {
		return nil, nil, err
	}
	reported := map[string]bool{}
	stored := make([]*torporv1.Worker, 0, len(workers))
	for _, w := range workers {
		s, err := e.upsertWorker(ctx, w)
		if err != nil {
			return nil, nil, err
		}
		stored = append(stored, s)
		reported[workerKey(w)] = true
	}
	all, err := store.ListAll(ctx, e.store.Workers(), store.ListOptions{Filter: store.Filter{"node": name}})
	if err != nil {
		return nil, nil, err
	}
	var gone []*torporv1.Worker
	for _, w := range all {
		if !reported[workerKey(w)] {
			gone = append(gone, w)
		}
	}
	if err := e.RemoveWorkers(ctx, gone, fmt.Sprintf("disappeared from node %s", name)); err != nil {
		return nil, nil, err
	}
	return node, stored, nil
}

// DeleteWorker deletes worker space/name (uid and version, when set,
// must match) unless it hosts an actor: the actor would point at a worker
// that no longer exists (invariant 1).
func (e *Engine) DeleteWorker(ctx context.Context, space, name, uid string, version int64) error {
	return e.store.InTx(ctx, func(tx store.Tx) error {
		w, err := tx.Workers().Get(ctx, space, name)
		if err != nil {
			return err
		}
		if a := w.GetStatus().GetActor(); a.GetUid() != "" {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "worker %s/%s hosts actor %s/%s: suspend it first", space, name, a.GetSpace(), a.GetName())
		}
		return tx.Workers().Delete(ctx, space, name, uid, version)
	})
}

// RemoveWorkers deletes workers that are gone from their node, crashing
// the actor each hosted with reason (prefixed with the worker's name).
func (e *Engine) RemoveWorkers(ctx context.Context, workers []*torporv1.Worker, reason string) error {
	for _, w := range workers {
		if w.GetStatus().GetActor().GetUid() != "" {
			if err := e.CrashWorkerActor(ctx, w, fmt.Sprintf("worker %s %s", w.GetMetadata().GetName(), reason)); err != nil {
				return err
			}
		}
		if err := e.store.Workers().Delete(ctx, w.GetMetadata().GetSpace(), w.GetMetadata().GetName(), w.GetMetadata().GetUid(), 0); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	return nil
}

// upsertNode records n with a fresh heartbeat. Updating the record bumps
// its version, so a crash of this node's actors decided on the record
// before (crashOnLostNode) aborts instead of landing after the agent read
// its placements.
func (e *Engine) upsertNode(ctx context.Context, n *torporv1.Node) (*torporv1.Node, error) {
	name := n.GetMetadata().GetName()
	now := timestamppb.New(e.now())
	for range maxRegisterAttempts {
		cur, err := e.store.Nodes().Get(ctx, "", name)
		if errors.Is(err, store.ErrNotFound) {
			created, err := e.store.Nodes().Create(ctx, &torporv1.Node{
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
		updated, err := e.store.Nodes().Update(ctx, cur)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		return updated, err
	}
	return nil, fmt.Errorf("register node %s: too many concurrent changes", name)
}

// upsertWorker records w as its node reports it (spec and labels), keeping
// the stored uid and placement.
func (e *Engine) upsertWorker(ctx context.Context, w *torporv1.Worker) (*torporv1.Worker, error) {
	ns, name := w.GetMetadata().GetSpace(), w.GetMetadata().GetName()
	for range maxRegisterAttempts {
		cur, err := e.store.Workers().Get(ctx, ns, name)
		if errors.Is(err, store.ErrNotFound) {
			created, err := e.store.Workers().Create(ctx, &torporv1.Worker{
				Metadata: &torporv1.ObjectMeta{Name: name, Space: ns, Labels: w.GetMetadata().GetLabels()},
				Spec:     w.GetSpec(), Status: &torporv1.WorkerStatus{},
			})
			if errors.Is(err, store.ErrAlreadyExists) {
				continue
			}
			return created, err
		}
		if err != nil {
			return nil, err
		}
		if cur.GetSpec().GetNode() != w.GetSpec().GetNode() {
			return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "worker %s/%s belongs to node %s", ns, name, cur.GetSpec().GetNode())
		}
		if proto.Equal(cur.GetSpec(), w.GetSpec()) && proto.Equal(&torporv1.ObjectMeta{Labels: cur.GetMetadata().GetLabels()}, &torporv1.ObjectMeta{Labels: w.GetMetadata().GetLabels()}) {
			return cur, nil
		}
		cur.Spec = w.GetSpec()
		cur.Metadata.Labels = w.GetMetadata().GetLabels()
		updated, err := e.store.Workers().Update(ctx, cur)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		return updated, err
	}
	return nil, fmt.Errorf("register worker %s/%s: too many concurrent changes", ns, name)
}

// Heartbeat records that node is alive and returns the time recorded. A
// node never registered, or one silent for longer than the heartbeat
// timeout, is NotFound: a lost node's actors may have crashed and moved
// on, and registering again tells its agent which of its workloads it
// still hosts (the agent registers again on NotFound).
func (e *Engine) Heartbeat(ctx context.Context, node string, mem HostMemory) (*timestamppb.Timestamp, error) {
	for range maxRegisterAttempts {
		n, err := e.store.Nodes().Get(ctx, "", node)
		if errors.Is(err, store.ErrNotFound) {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "node %s is not registered: register it first", node)
		}
		if err != nil {
			return nil, err
		}
		if last := n.GetHeartbeatTime(); last != nil && !e.alive(n) {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "node %s was lost (last heartbeat %s): register again", node, last.AsTime().Format(time.RFC3339Nano))
		}
		n.HeartbeatTime = timestamppb.New(e.now())
		n.MemoryAvailableBytes, n.MemoryTotalBytes = mem.Available, mem.Total
		if _, err := e.store.Nodes().Update(ctx, n); errors.Is(err, store.ErrConflict) {
			continue
		} else if err != nil {
			return nil, err
		}
		return n.HeartbeatTime, nil
	}
	return nil, errdefs.Errorf(errdefs.ErrAborted, "heartbeat of node %s: too many concurrent changes", node)
}
