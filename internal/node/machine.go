package node

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/runtime"
)

// slotMachine is the node's slot state machine. It moves each worker slot
// through its phases (slots.go) one operation at a time, recording every
// outcome together with the slot's new state (ops.go), offers those
// operations to the API's edge (lifecycle.go, served by agentAPI in
// edge.go), and at startup settles what a previous agent left
// (reconcile.go). What a
// workload needs besides its slot comes from the parts beside it.
type slotMachine struct {
	node string
	log  *slog.Logger
	// rt is the runtime as the node calls it, base as configured: what
	// optional interfaces it implements is asked of base.
	rt      runtime.Runtime
	base    runtime.Runtime
	timeout time.Duration
	// workDir holds the checkpoints' stage directories.
	workDir string
	journal journal
	metrics *metrics

	slots  []*slot
	byName map[string]*slot
	// slotsChanged tells registration that a slot came back into service.
	slotsChanged func()
	// placing makes a claim and a removal of volumes see every slot as it
	// is: an actor occupies one slot of the node at most (its volume
	// directory is per actor), and its volumes go only when it occupies
	// none.
	placing sync.Mutex

	mu       sync.Mutex
	inflight map[opKey]*call
	// ops are the operations running and the work they left to finish
	// in the background (dropping local checkpoints, warm-ups): a stopping
	// agent waits for them.
	ops sync.WaitGroup

	images    images
	snapshots *snapshots // set when the agent opens its state directory
	volumes   volumeDirs
	identity  *workloadIdentity
	probes    *prober
	warm      *warmer
	logs      *actorLogs
	// gate admits routed connections to the actor each slot hosts.
	gate slotGate
	// freezes carries the gate's freezes and thaws to the control plane.
	freezes *freezeReports
	// starts bounds the sandboxes starting (booting or restoring) at
	// once to twice the CPUs (a start is mostly CPU, and waits on its
	// processes and the disk the rest of the time): forty sharing two
	// CPUs all finished together, after the time of forty, where bounded
	// the first ones answer after the time of a few (BenchmarkBurst).
	starts chan struct{}
	// guest is the file helper run inside sandboxes (guestfiles.go).
	guest *guestHelper

	// watching is the life of the workloads' exit watches (exits.go),
	// ended by stopWatches; watchers are their goroutines, and those
	// reporting exits to the control plane (exitReports).
	watching    context.Context
	stopWatches context.CancelFunc
	watchers    sync.WaitGroup
	exitReports exitReporter
	// egress enforces the workloads' egress policies (egress_hook.go).
	egress *egressGuard
}

func newSlotMachine(cfg Config, log *slog.Logger, d dirs, id *workloadIdentity) *slotMachine {
	m := &slotMachine{
		node: cfg.Name, log: log, base: cfg.Runtime, timeout: cfg.OperationTimeout, workDir: d.work,
		journal: journal{dir: d.ops}, byName: map[string]*slot{}, inflight: map[opKey]*call{},
		images:   images{policy: cfg.Images, dir: d.images},
		volumes:  volumeDirs{root: d.volumes, log: log},
		identity: id,
		probes:   &prober{client: newProbeClient(), rt: cfg.Runtime},
		logs:     newActorLogs(d.logs, d.output, log),
		freezes:  newFreezeReports(),
		guest:    &guestHelper{source: cfg.GuestHelper, dir: id.root},
		starts:   make(chan struct{}, 2*goruntime.GOMAXPROCS(0)),
	}
	m.gate = newSlotGate(cfg, log, m.freezes.add)
	m.rt = awakeRuntime{Runtime: cfg.Runtime, gate: m.gate}
	m.watching, m.stopWatches = context.WithCancel(context.Background())
	m.metrics = newMetrics(cfg.Registry, m.busy)
	m.egress = &egressGuard{ceiling: !cfg.NoEgress, log: log, index: m.index,
		clients: map[netip.Addr]egressClient{}, pending: map[string]*egressPending{},
		metric: func(space, actor string, n uint64) {
			m.metrics.egressDenied.WithLabelValues(space, actor).Add(float64(n))
		}}
	if pn, ok := cfg.Network.(PolicyNetwork); ok {
		m.egress.network = pn
	}
	m.warm = &warmer{off: cfg.NoWarm, rt: cfg.Runtime, log: log, workload: m.warmWorkload, background: m.ops.Go}
	return m
}

// openSlots makes the node's slots from their records in dir, with their
// network, and drops what the records no longer claim: old operation
// outcomes and checkpoint stages.
func (m *slotMachine) openSlots(ctx context.Context, network Network, workers int, dir string) error {
	if err := m.journal.prune(time.Now().Add(-opRetention)); err != nil {
		m.log.Warn("operation journal not pruned", "err", err)
	}
	for i := range workers {
		name := WorkerName(m.node, i)
		rs, err := network.Slot(ctx, name, i)
		if err != nil {
			return fmt.Errorf("worker %s: network: %w", name, err)
		}
		if rs.Output, err = m.logs.outputDir(name); err != nil {
			return fmt.Errorf("worker %s: output: %w", name, err)
		}
		s := newSlot(rs, filepath.Join(dir, name+".json"))
		s.occupy = func(rec slotRecord) { m.gate.Occupy(name, rs.IP, rec.admits(), m.freezeOf(s, rec)) }
		if err := s.load(); err != nil {
			return err
		}
		m.slots = append(m.slots, s)
		if m.egress.network != nil && m.images.nameserver == "" {
			m.images.nameserver = rs.Gateway
		}
		m.byName[name] = s
	}
	// Once the slots are there: it reads them.
	m.metrics.registry.MustRegister(actorUsage{m})
	return m.pruneStages()
}

func (m *slotMachine) slot(worker string) (*slot, error) {
	if s := m.byName[worker]; s != nil {
		return s, nil
	}
	if worker == "" {
		return nil, invalid("op.worker", "required")
	}
	return nil, errdefs.Errorf(errdefs.ErrNotFound, "worker %s is not on node %s", worker, m.node)
}

// index is s's index among the node's slots (its network's).
func (m *slotMachine) index(s *slot) int {
	for i, o := range m.slots {
		if o == s {
			return i
		}
	}
	return -1
}

// busy counts the slots hosting a workload.
func (m *slotMachine) busy() int {
	n := 0
	for _, s := range m.slots {
		if s.current().ActorUID != "" {
			n++
		}
	}
	return n
}

// warmWorkload is w as a start in s will pass it to the runtime: the same
// root filesystems, volume directories (made only at the start) and
// identity directory.
func (m *slotMachine) warmWorkload(ctx context.Context, s *slot, w *torporv1.Workload) (runtime.Workload, error) {
	rootfs, images, err := m.images.unpack(ctx, w)
	if err != nil {
		return runtime.Workload{}, err
	}
	volumes := map[string]string{}
	for _, name := range durableVolumes(w.GetTemplate()) {
		volumes[name] = filepath.Join(m.volumes.dir(w.GetActorUid()), name)
	}
	return runtime.Workload{
		ActorUID: w.GetActorUid(), Space: w.GetSpace(), Actor: w.GetActor(),
		Template: w.GetTemplate(), Rootfs: rootfs, ImageConfig: images, Volumes: volumes,
		ExtraMounts: map[string]string{IdentityMountPath: m.identity.dir(s)},
	}, nil
}
