package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/retry"
	"github.com/torpor-dev/torpor/internal/validate"
)

// membership is the node as a member of the installation: its certificate
// (see credentials.go), its registration with the control plane and its
// heartbeats, and the control plane's records of its workers, which
// workload identities name (workerRecords).
type membership struct {
	name      string
	serverURL string
	pool      string
	labels    map[string]string
	interval  time.Duration
	log       *slog.Logger
	// cert keeps the node's certificate in the state directory.
	cert *identity.Member

	// slots are registered as workers (set when the agent opens them);
	// orphans removes the workloads the control plane no longer places on
	// them.
	slots   []*slot
	class   string
	orphans orphanRemover

	// gate is the slot gate's advertised address (set when it listens).
	gate string

	// workers are the records the control plane answered the latest
	// registration with, by worker name; registered is closed after the
	// first.
	mu         sync.Mutex
	workers    map[string]*torporv1.Worker
	registered chan struct{}
	// resync asks for a registration of the slots in service now.
	resync chan struct{}
}

// orphanRemover removes workloads the control plane gave up on while the
// node was out of touch: the slot state machine (slotMachine.dropOrphans).
type orphanRemover interface {
	dropOrphans(ctx context.Context, slots []*slot, workers []*torporv1.Worker)
}

// workerRecords are the control plane's records of this node's workers, as
// registration answered them (membership.registeredWorker).
type workerRecords interface {
	registeredWorker(ctx context.Context, worker string) (*torporv1.Worker, error)
}

func newMembership(cfg Config, log *slog.Logger) *membership {
	return &membership{
		name: cfg.Name, serverURL: strings.TrimSuffix(cfg.ServerURL, "/"), pool: cfg.Pool, labels: cfg.Labels,
		interval: cfg.HeartbeatInterval, log: log, cert: nodeMember(cfg, log), class: cfg.Runtime.Class(),
		registered: make(chan struct{}), resync: make(chan struct{}, 1),
	}
}

// stayRegistered registers the node and its workers, then heartbeats; a
// control plane that lost the node (or was unreachable) gets it again.
func (m *membership) stayRegistered(ctx context.Context, client torporv1connect.NodeServiceClient, address string) {
	registered := false
	backoff := retry.Policy{Initial: 100 * time.Millisecond, Max: m.interval}.Start()
	for {
		// A control plane that does not answer must not stall the loop.
		callCtx, cancel := context.WithTimeout(ctx, controlPlaneTimeout)
		if !registered {
			if err := m.register(callCtx, client, address); err != nil {
				m.log.Warn("registration with the control plane failed; retrying", "server", m.serverURL, "err", err)
			} else {
				registered = true
			}
		} else if _, err := client.Heartbeat(callCtx, connect.NewRequest(m.heartbeat())); err != nil {
			m.log.Warn("heartbeat failed", "server", m.serverURL, "err", err)
			registered = !errors.Is(errdefs.FromConnect(err), errdefs.ErrNotFound)
		}
		cancel()
		if !registered {
			if !backoff.Wait(ctx) {
				return
			}
			continue
		}
		backoff.Reset()
		select {
		case <-ctx.Done():
			return
		case <-m.resync:
			registered = false
		case <-time.After(m.interval):
		}
	}
}

// slotsChanged registers the node again, with the slots in service now.
func (m *membership) slotsChanged() {
	select {
	case m.resync <- struct{}{}:
	default:
	}
}

func (m *membership) register(ctx context.Context, client torporv1connect.NodeServiceClient, address string) error {
	req := &torporv1.RegisterNodeRequest{Node: &torporv1.Node{
		Metadata:       &torporv1.ObjectMeta{Name: m.name, Labels: m.labels},
		Address:        address,
		SandboxClasses: []string{m.class},
	}}
	for _, s := range m.slots {
		if s.outOfService.Load() {
			continue
		}
		req.Workers = append(req.Workers, &torporv1.Worker{
			Metadata: &torporv1.ObjectMeta{Name: s.name(), Space: validate.WorkerNamespace, Labels: m.labels},
			Spec:     &torporv1.WorkerSpec{Node: m.name, Ip: s.rt.IP, Pool: m.pool, SandboxClass: m.class, Gate: m.gate},
		})
	}
	// Idle slots stay locked until the placements read by this call are
	// applied, so nothing is placed on them in between. A slot busy with
	// an operation is left to it.
	var idle []*slot
	for _, s := range m.slots {
		if s.tryLock() {
			idle = append(idle, s)
		}
	}
	defer func() {
		for _, s := range idle {
			s.unlock()
		}
	}()
	resp, err := client.RegisterNode(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	m.recordWorkers(resp.Msg.GetWorkers())
	m.log.Info("registered with the control plane", "server", m.serverURL, "workers", len(resp.Msg.GetWorkers()))
	m.orphans.dropOrphans(ctx, idle, resp.Msg.GetWorkers())
	return nil
}

// recordWorkers keeps the control plane's records of this node's workers.
func (m *membership) recordWorkers(workers []*torporv1.Worker) {
	byName := make(map[string]*torporv1.Worker, len(workers))
	for _, w := range workers {
		m.log.Debug("worker registered", "worker", w.GetMetadata().GetName(), "uid", w.GetMetadata().GetUid())
		byName[w.GetMetadata().GetName()] = w
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.workers = byName
	select {
	case <-m.registered:
	default:
		close(m.registered)
	}
}

// registeredWorker returns the control plane's record of a worker of this
// node (its namespace and uid name it in mint requests). A restarted agent
// may be asked to run a workload before it registered again, so this
// waits for the first registration, as long as ctx allows.
func (m *membership) registeredWorker(ctx context.Context, worker string) (*torporv1.Worker, error) {
	select {
	case <-m.registered:
	case <-ctx.Done():
		return nil, fmt.Errorf("worker %s: the node has not registered with the control plane yet: %w", worker, ctx.Err())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	w, ok := m.workers[worker]
	if !ok {
		return nil, fmt.Errorf("worker %s: the control plane did not register it", worker)
	}
	return w, nil
}

// heartbeat is the node's heartbeat: its name and the host's memory (left
// out, with a warning, when it cannot be read).
func (m *membership) heartbeat() *torporv1.HeartbeatRequest {
	req := &torporv1.HeartbeatRequest{Node: m.name}
	avail, total, err := hostMemory(meminfoPath)
	if err != nil {
		m.log.Warn("heartbeat without the host's memory: the control plane cannot relieve it", "err", err)
		return req
	}
	req.MemoryAvailableBytes, req.MemoryTotalBytes = avail, total
	return req
}
