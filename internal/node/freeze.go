package node

// Freezing, the idle ladder's first rung, as the node drives it. The slot
// gate freezes and thaws (slotgate/freeze.go): it is in the path of
// every routed byte, and as a process of its own it outlives the agent,
// so a frozen actor is thawed by its traffic while no agent runs. The
// agent tells the gate, with each slot's occupant, how it freezes (the
// template's IdlePolicy.freeze_seconds and the sandbox's control
// socket), holds the slot awake around whatever reaches the sandbox
// another way (awakeRuntime), and reports each freeze and thaw to the
// control plane (NodeService.ReportFrozen), which shows it as the actor's
// status.frozen_time and prefers frozen actors when it evicts.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/retry"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/slotgate"
)

// freezableRuntime is a runtime whose sandboxes can be paused in place
// through a control of theirs (gvisor: the sandbox's control socket).
type freezableRuntime interface {
	ControlSocket(slot runtime.Slot) (string, error)
	PauseSandbox(ctx context.Context, control string) error
	ResumeSandbox(ctx context.Context, control string) error
}

// sandboxPauser is a slotgate.Pauser over a freezableRuntime.
type sandboxPauser struct {
	rt      freezableRuntime
	control string
}

func (p sandboxPauser) Pause(ctx context.Context) error  { return p.rt.PauseSandbox(ctx, p.control) }
func (p sandboxPauser) Resume(ctx context.Context) error { return p.rt.ResumeSandbox(ctx, p.control) }

// pausers is the slot gate's Pausers for rt; nil when rt cannot freeze.
func pausers(rt runtime.Runtime) func(string) slotgate.Pauser {
	fr, ok := rt.(freezableRuntime)
	if !ok {
		return nil
	}
	return func(control string) slotgate.Pauser { return sandboxPauser{fr, control} }
}

// freezeOf is how the workload rec describes is frozen when idle: only
// once it runs (a start or a stop in progress is never frozen), when its
// template asks for it and the runtime can.
func (m *slotMachine) freezeOf(s *slot, rec slotRecord) slotgate.Freeze {
	fr, ok := m.base.(freezableRuntime)
	if !ok || rec.Phase != phaseRunning {
		return slotgate.Freeze{}
	}
	w, err := rec.workload()
	if err != nil {
		return slotgate.Freeze{}
	}
	secs := w.GetTemplate().GetIdlePolicy().GetFreezeSeconds()
	if secs <= 0 {
		return slotgate.Freeze{}
	}
	control, err := fr.ControlSocket(s.rt)
	if err != nil {
		m.log.Warn("workload not frozen when idle: its sandbox's control is not known", "worker", s.name(), "actor_uid", rec.ActorUID, "err", err)
		return slotgate.Freeze{}
	}
	return slotgate.Freeze{After: time.Duration(secs) * time.Second, Control: control}
}

// awakeRuntime is the node's runtime with every call that needs the
// sandbox to run (a checkpoint, a terminate, an exec, which file access
// is too) made while the slot gate holds the slot awake: a frozen
// sandbox is thawed first and not frozen again until the call returns.
// Every path to those calls goes through it.
type awakeRuntime struct {
	runtime.Runtime
	gate slotGate
}

func (r awakeRuntime) hold(slot runtime.Slot, what string) (func(), error) {
	release, err := r.gate.Hold(slot.Name)
	if err != nil {
		return nil, fmt.Errorf("worker %s: thaw before %s: %w", slot.Name, what, err)
	}
	return release, nil
}

func (r awakeRuntime) Checkpoint(ctx context.Context, slot runtime.Slot, imageDir string, leaveRunning bool) error {
	release, err := r.hold(slot, "its checkpoint")
	if err != nil {
		return err
	}
	defer release()
	return r.Runtime.Checkpoint(ctx, slot, imageDir, leaveRunning)
}

// Terminate goes on when the thaw fails: a sandbox that cannot be
// resumed is ended all the same.
func (r awakeRuntime) Terminate(ctx context.Context, slot runtime.Slot) error {
	if release, err := r.hold(slot, "its end"); err == nil {
		defer release()
	}
	return r.Runtime.Terminate(ctx, slot)
}

func (r awakeRuntime) Exec(ctx context.Context, slot runtime.Slot, container string, cmd []string) error {
	release, err := r.hold(slot, "an exec")
	if err != nil {
		return err
	}
	defer release()
	return r.Runtime.Exec(ctx, slot, container, cmd)
}

func (r awakeRuntime) ExecStream(ctx context.Context, slot runtime.Slot, p runtime.ExecSpec) (int, error) {
	release, err := r.hold(slot, "an exec")
	if err != nil {
		return 0, err
	}
	defer release()
	return r.Runtime.ExecStream(ctx, slot, p)
}

// frozenReporter is where freezes and thaws go (NodeService).
type frozenReporter interface {
	ReportFrozen(context.Context, *connect.Request[torporv1.ReportFrozenRequest]) (*connect.Response[torporv1.ReportFrozenResponse], error)
}

// freezeReports carries the gate's freezes and thaws to the control
// plane: the latest change per worker, so a report that waits for a
// control plane that is away is replaced by a newer one, not queued.
type freezeReports struct {
	mu      sync.Mutex
	pending map[string]slotgate.Change // by worker
	wake    chan struct{}
}

func newFreezeReports() *freezeReports {
	return &freezeReports{pending: map[string]slotgate.Change{}, wake: make(chan struct{}, 1)}
}

// add is the gate's Notify: it never blocks.
func (f *freezeReports) add(c slotgate.Change) {
	f.mu.Lock()
	f.pending[c.Worker] = c
	f.mu.Unlock()
	f.poke()
}

func (f *freezeReports) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *freezeReports) take() []slotgate.Change {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]slotgate.Change, 0, len(f.pending))
	for w, c := range f.pending {
		out = append(out, c)
		delete(f.pending, w)
	}
	return out
}

// putBack keeps c for the next round unless a newer change came.
func (f *freezeReports) putBack(c slotgate.Change) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, newer := f.pending[c.Worker]; !newer {
		f.pending[c.Worker] = c
	}
}

// reportFreezes reports the changes as they come until ctx ends; one the
// control plane could not take is tried again a moment later.
func (m *slotMachine) reportFreezes(ctx context.Context, to frozenReporter) error {
	backoff := retry.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second}.Start()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-m.freezes.wake:
		}
		failed := false
		for _, c := range m.freezes.take() {
			if err := m.reportFreeze(ctx, to, c); err != nil {
				m.log.Warn("freeze report failed; retrying", "worker", c.Worker, "actor_uid", c.ActorUID, "frozen", c.Frozen, "err", err)
				m.freezes.putBack(c)
				failed = true
			}
		}
		if !failed {
			backoff.Reset()
			continue
		}
		if !backoff.Wait(ctx) {
			return nil
		}
		m.freezes.poke()
	}
}

// reportFreeze reports c, unless the slot runs another workload by now
// (nothing to report) or the control plane refuses it for good (logged).
func (m *slotMachine) reportFreeze(ctx context.Context, to frozenReporter, c slotgate.Change) error {
	s := m.byName[c.Worker]
	if s == nil {
		return nil
	}
	rec := s.current()
	if rec.ActorUID != c.ActorUID || rec.Phase != phaseRunning {
		return nil
	}
	req := &torporv1.ReportFrozenRequest{Node: m.node, Worker: c.Worker, ActorUid: c.ActorUID, OperationId: rec.Operation, Frozen: c.Frozen, Time: timestamppb.New(c.Time)}
	rctx, cancel := context.WithTimeout(ctx, controlPlaneTimeout)
	defer cancel()
	_, err := to.ReportFrozen(rctx, connect.NewRequest(req))
	if err != nil && refusedReport(errdefs.FromConnect(err)) {
		m.log.Warn("the control plane refused a freeze report", "worker", c.Worker, "actor_uid", c.ActorUID, "err", err)
		return nil
	}
	return err
}
