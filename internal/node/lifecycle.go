package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/tracing"
)

// Run cold-boots the actor's workload with empty durable volumes.
func (m *slotMachine) run(ctx context.Context, req *torporv1.RunRequest) (*torporv1.RunResponse, error) {
	op, w := req.GetOp(), req.GetWorkload()
	if err := validateWorkload(op, w); err != nil {
		return nil, err
	}
	return operate(ctx, m, "Run", op, func(ctx context.Context, s *slot) (*torporv1.RunResponse, error) {
		st, err := m.start(ctx, s, op, w, noSource, req.GetCheckPort())
		if err != nil {
			return nil, err
		}
		return &torporv1.RunResponse{WorkerIp: s.rt.IP, Warnings: st.warnings}, nil
	})
}

// Restore brings the actor back from its snapshot (and the template's
// golden image for DATA_ON_GOLDEN).
func (m *slotMachine) restore(ctx context.Context, msg *torporv1.RestoreRequest) (*torporv1.RestoreResponse, error) {
	op, w := msg.GetOp(), msg.GetWorkload()
	if err := validateWorkload(op, w); err != nil {
		return nil, err
	}
	if err := validateRestore(msg); err != nil {
		return nil, err
	}
	return operate(ctx, m, "Restore", op, func(ctx context.Context, s *slot) (*torporv1.RestoreResponse, error) {
		began := time.Now()
		started, err := m.start(ctx, s, op, w, func(ctx context.Context) (bootSource, func(bool), error) { return m.snapshots.source(ctx, msg) }, false)
		if err != nil {
			return nil, err
		}
		return &torporv1.RestoreResponse{WorkerIp: s.rt.IP, DurationMs: time.Since(began).Milliseconds(), Warm: started.warm, Steps: started.steps}, nil
	})
}

// Checkpoint captures the actor (memory and volumes for FULL, volumes only
// for DATA) to snapshot storage or this node, and frees the worker unless
// asked to leave the workload running.
func (m *slotMachine) takeCheckpoint(ctx context.Context, msg *torporv1.CheckpointRequest) (*torporv1.CheckpointResponse, error) {
	if err := validateCheckpoint(msg); err != nil {
		return nil, err
	}
	return operate(ctx, m, "Checkpoint", msg.GetOp(), func(ctx context.Context, s *slot) (*torporv1.CheckpointResponse, error) {
		cur := s.current()
		if cur.Capture != msg.GetOp().GetOperationId() || cur.ActorUID != msg.GetOp().GetActorUid() {
			if err := recordedExit(s, cur, msg.GetOp().GetActorUid()); err != nil {
				return nil, err
			}
			if err := hosts(s, cur, msg.GetOp().GetActorUid()); err != nil {
				return nil, err
			}
		}
		return m.checkpoint(ctx, s, cur, msg)
	})
}

// Terminate stops the actor's workload and removes its volumes; its log
// is kept for reading (with what the workload wrote last) unless the
// request drops it. A worker that hosts another actor is left alone.
func (m *slotMachine) terminate(ctx context.Context, req *torporv1.TerminateRequest) (*torporv1.TerminateResponse, error) {
	op := req.GetOp()
	return operate(ctx, m, "Terminate", op, func(ctx context.Context, s *slot) (*torporv1.TerminateResponse, error) {
		cur := s.current()
		var dropLog error
		if req.GetDropLog() {
			dropLog = m.logs.remove(op.GetActorUid())
		}
		switch cur.ActorUID {
		case "":
			// Already stopped; its volumes may still be here.
			m.warm.drop(ctx, s, op.GetActorUid())
			return &torporv1.TerminateResponse{}, errors.Join(m.removeVolumes(op.GetActorUid()), dropLog)
		case op.GetActorUid():
			m.warm.drop(ctx, s, op.GetActorUid())
			if err := m.vacate(ctx, s, cur); err != nil {
				return nil, err
			}
			if req.GetDropLog() {
				return &torporv1.TerminateResponse{}, m.logs.remove(op.GetActorUid())
			}
			m.logs.keep(op.GetActorUid(), "stopped on node %s, worker %s (no checkpoint)", m.node, s.name())
			return &torporv1.TerminateResponse{}, nil
		}
		if dropLog != nil {
			return nil, dropLog
		}
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "worker %s hosts actor %s, not %s: not terminating it", s.name(), cur.ActorUID, op.GetActorUid())
	})
}

// DropCheckpoint removes a local checkpoint whose record the control
// plane deleted, and the chunks only it named. No operation of this node
// still uses it: the control plane deletes a local checkpoint's record
// only while the actor runs no operation that could (a paused, crashed or
// deleting actor, or after the resume that read it ended), and the
// Checkpoint that wrote it answered before the record existed, a repeat
// of it answering from its recorded result.
func (m *slotMachine) dropCheckpoint(ctx context.Context, req *torporv1.DropCheckpointRequest) (*torporv1.DropCheckpointResponse, error) {
	location := req.GetLocation()
	_, actorUID, _, err := snapshot.ParseLocation(location)
	if err != nil {
		return nil, invalid("location", "%v", err)
	}
	if err := m.snapshots.removeLocal(ctx, location); err != nil {
		return nil, err
	}
	m.snapshots.cache.Forget(location)
	// The log a pause left here goes with its checkpoint, unless the
	// actor runs here again (restored from it).
	if err := m.removeLog(actorUID); err != nil {
		m.log.Warn("actor log not removed with its local checkpoint", "actor_uid", actorUID, "err", err)
	}
	return &torporv1.DropCheckpointResponse{}, nil
}

// Stats reports whether the worker's workload runs, whose it is and what
// it uses.
func (m *slotMachine) stats(ctx context.Context, req *torporv1.StatsRequest) (*torporv1.StatsResponse, error) {
	s, err := m.slot(req.GetWorker())
	if err != nil {
		return nil, err
	}
	cur := s.current()
	st, err := m.rt.Stats(ctx, s.rt)
	if err != nil {
		return nil, fmt.Errorf("worker %s: stats: %w", s.name(), err)
	}
	resp := &torporv1.StatsResponse{Running: st.Running, ActorUid: cur.ActorUID, MemoryBytes: st.MemoryBytes, CpuSeconds: st.CPU.Seconds()}
	if !st.Started.IsZero() {
		resp.Started = timestamppb.New(st.Started)
	}
	return resp, nil
}

// hosts checks that the slot runs actorUID's workload.
func hosts(s *slot, cur slotRecord, actorUID string) error {
	switch {
	case cur.ActorUID == "":
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "worker %s hosts no actor, not %s", s.name(), actorUID)
	case cur.ActorUID != actorUID:
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "worker %s hosts actor %s, not %s", s.name(), cur.ActorUID, actorUID)
	case cur.Phase != phaseRunning:
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "worker %s: actor %s is %s, not running", s.name(), actorUID, cur.Phase)
	}
	return nil
}

// bootSource is where a starting workload's state comes from: a memory
// image to restore (else it cold-boots) and a volume archive (else its
// volumes start empty).
type bootSource struct {
	memory string
	// golden: memory is a template's golden image, not the actor's own.
	golden bool
	data   string
	// logs: a snapshot tree with the actor's log to go on from.
	logs string
}

func noSource(context.Context) (bootSource, func(started bool), error) {
	return bootSource{}, func(bool) {}, nil
}

// start claims the slot for the actor, boots it from source and waits for
// it to be ready (with checkPort, accepting connections on its port too),
// reporting whether it started in a sandbox made ahead. On failure the
// slot is left free (or, if its sandbox would not stop, stopping).
func (m *slotMachine) start(ctx context.Context, s *slot, op *torporv1.Operation, w *torporv1.Workload, source func(context.Context) (bootSource, func(started bool), error), checkPort bool) (started, error) {
	claimed, err := m.claim(s, op, w)
	if err != nil {
		return started{}, err
	}
	st, err := m.boot(ctx, s, w, source, checkPort)
	if err != nil {
		ctx, cancel := cleanupContext(ctx)
		defer cancel()
		if verr := m.vacate(ctx, s, claimed); verr != nil {
			m.log.Error("cleaning up after a failed start", "worker", s.name(), "actor_uid", w.GetActorUid(), "err", verr)
		}
		return started{}, err
	}
	running, err := occupied(phaseRunning, op, w)
	if err != nil {
		return started{}, err
	}
	s.stage(running)
	m.follow(s, running, st.watch)
	m.hooks().running(ctx, s, w)
	return st, nil
}

// started is how a start went: whether into a sandbox made ahead, and its
// steps' durations (for the actor's history).
type started struct {
	warm  bool
	steps []*torporv1.StepDuration
	// watch watches the started workload for its exit.
	watch *exitWatch
	// warnings: what a port check found (start's checkPort).
	warnings []string
}

// warmStarts is a runtime that tells whether a slot's workload started
// in a sandbox made ahead.
type warmStarts interface {
	StartedWarm(slot runtime.Slot) bool
}

// claim reserves the slot for the actor. An actor occupies one slot of
// the node at most: its volume directories are per actor.
func (m *slotMachine) claim(s *slot, op *torporv1.Operation, w *torporv1.Workload) (slotRecord, error) {
	m.placing.Lock()
	defer m.placing.Unlock()
	actor := op.GetActorUid()
	switch cur := s.current(); cur.ActorUID {
	case "":
	case actor:
		return slotRecord{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s already occupies worker %s (operation %s)", actor, s.name(), cur.Operation)
	default:
		return slotRecord{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "worker %s is busy with actor %s", s.name(), cur.ActorUID)
	}
	for _, other := range m.slots {
		if other != s && other.current().ActorUID == actor {
			return slotRecord{}, errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s already occupies worker %s of this node", actor, other.name())
		}
	}
	rec, err := occupied(phaseStarting, op, w)
	if err != nil {
		return slotRecord{}, err
	}
	s.stage(rec)
	return rec, nil
}

// boot starts w in s from source and waits for it to be ready. The
// source's release says whether it did (snapshots.source).
func (m *slotMachine) boot(ctx context.Context, s *slot, w *torporv1.Workload, source func(context.Context) (bootSource, func(started bool), error), checkPort bool) (_ started, err error) {
	steps := m.startSteps(ctx, "start")
	rootfs, images, err := m.images.unpack(ctx, w)
	if err != nil {
		return started{}, err
	}
	steps.done("unpack")
	src, release, err := source(ctx)
	if err != nil {
		return started{}, err
	}
	defer func() {
		if err != nil {
			release(false)
			return
		}
		// Removing a spent tree takes ~0.1 s per 200 MB: not on the
		// start's path. Not held for the start's record either: the
		// cache does not outlive the agent, and without a restart no
		// retry restores the start again.
		m.ops.Go(func() { release(true) })
	}()
	steps.done("fetch")
	volumes, err := prepareVolumes(ctx, m.volumes.dir(w.GetActorUid()), durableVolumes(w.GetTemplate()), src.data)
	if err != nil {
		return started{}, fmt.Errorf("actor %s/%s: durable volumes: %w", w.GetSpace(), w.GetActor(), err)
	}
	steps.done("volumes")
	hooks := m.hooks()
	mounts, err := hooks.starting(ctx, s, w, src)
	if err != nil {
		return started{}, err
	}
	supervisor, err := m.placeEnvd(s, w)
	if err != nil {
		return started{}, err
	}
	steps.done("identity")
	rw := runtime.Workload{
		ActorUID: w.GetActorUid(), Space: w.GetSpace(), Actor: w.GetActor(),
		Template: w.GetTemplate(), Rootfs: rootfs, ImageConfig: images, Volumes: volumes, ExtraMounts: mounts,
	}
	if !src.golden {
		// runsc restores a sandbox only with the argv it was checkpointed
		// with: an E2B sandbox's own snapshot has the supervisor (every
		// one cold-boots, workflow.DecideRestore), a golden image never.
		rw.Init = supervisor
	}
	select {
	case m.starts <- struct{}{}:
	case <-ctx.Done():
		return started{}, fmt.Errorf("actor %s/%s on worker %s: waiting for a start to end: %w", w.GetSpace(), w.GetActor(), s.name(), context.Cause(ctx))
	}
	if src.memory == "" {
		err = m.rt.Run(ctx, s.rt, rw)
	} else {
		err = m.rt.Restore(ctx, s.rt, rw, src.memory)
	}
	<-m.starts
	if err != nil {
		return started{}, fmt.Errorf("actor %s/%s on worker %s: %w", w.GetSpace(), w.GetActor(), s.name(), err)
	}
	watch := m.watch(s)
	defer func() {
		if err != nil {
			watch.cancel()
		}
	}()
	hooks.started(s, w, src.memory != "")
	steps.done("start")
	if err := m.ensureEnvd(ctx, s, w, rw.Init != nil); err != nil {
		return started{}, err
	}
	if wantsEnvd(w) {
		steps.done("envd")
	}
	warm := false
	if ws, ok := m.base.(warmStarts); ok {
		warm = ws.StartedWarm(s.rt)
	}
	err = m.probes.waitReady(ctx, s, w, watch.done)
	var warnings []string
	if err == nil && checkPort {
		var warning string
		if warning, err = m.probes.checkPort(ctx, s, w, watch.done); warning != "" {
			warnings = append(warnings, warning)
		}
	}
	if errors.Is(err, errExited) {
		return started{}, exitError(m.describeExit(s, w.GetActorUid(), watch.exit))
	}
	if err != nil {
		return started{}, err
	}
	steps.done("ready")
	if warning := m.egress.lowered(w); warning != "" {
		warnings = append(warnings, warning)
		m.logs.mark(w.GetActorUid(), "%s", warning)
	}
	m.log.Debug("start steps", append([]any{"worker", s.name(), "actor_uid", w.GetActorUid(), "restore", src.memory != "", "warm", warm}, steps.attrs...)...)
	return started{warm: warm, steps: steps.steps, watch: watch, warnings: warnings}, nil
}

// cleanupContext gives the cleanup after a failure its own time: the
// failure may have been the operation running out of it.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
}

// vacate stops the slot's workload and removes the actor's volumes. The
// slot is free afterwards, or stays the actor's (stopping) if its sandbox
// would not go away, so no other actor lands on a half-removed one.
func (m *slotMachine) vacate(ctx context.Context, s *slot, cur slotRecord) error {
	stopping := cur
	stopping.Phase = phaseStopping
	s.stage(stopping)
	if err := m.rt.Terminate(ctx, s.rt); err != nil {
		return fmt.Errorf("worker %s: stop the workload of actor %s: %w", s.name(), cur.ActorUID, err)
	}
	hooksErr := m.hooks().stopped(s)
	var stageErr error
	if cur.Capture != "" {
		stageErr = removeStage(m.stageDir(cur.ActorUID, cur.Capture))
	}
	s.stage(slotRecord{})
	return errors.Join(hooksErr, stageErr, m.removeVolumes(cur.ActorUID))
}

// stepTimer times the steps of an operation (start, checkpoint), for its
// debug log, torpor_node_step_seconds and the operation's trace.
type stepTimer struct {
	ctx       context.Context
	operation string
	seconds   *prometheus.HistogramVec
	last      time.Time
	attrs     []any
	steps     []*torporv1.StepDuration
}

func (m *slotMachine) startSteps(ctx context.Context, operation string) *stepTimer {
	return &stepTimer{ctx: ctx, operation: operation, seconds: m.metrics.steps, last: time.Now()}
}

// done records the time since the previous step as step's duration.
func (t *stepTimer) done(step string) {
	now := time.Now()
	t.attrs = append(t.attrs, step, now.Sub(t.last).Round(time.Microsecond))
	t.steps = append(t.steps, &torporv1.StepDuration{Name: step, DurationUs: now.Sub(t.last).Microseconds()})
	t.seconds.WithLabelValues(t.operation, step).Observe(now.Sub(t.last).Seconds())
	tracing.Phase(t.ctx, "node."+step, t.last, now)
	t.last = now
}

// removeLog deletes the log this node keeps of the actor, unless the
// actor occupies a slot of this node.
func (m *slotMachine) removeLog(actorUID string) error {
	m.placing.Lock()
	defer m.placing.Unlock()
	for _, s := range m.slots {
		if s.current().ActorUID == actorUID {
			return nil
		}
	}
	return m.logs.remove(actorUID)
}

// removeVolumes deletes the actor's volume directories, unless the actor
// occupies a slot of this node.
func (m *slotMachine) removeVolumes(actorUID string) error {
	m.placing.Lock()
	defer m.placing.Unlock()
	for _, s := range m.slots {
		if s.current().ActorUID == actorUID {
			return nil
		}
	}
	return m.volumes.remove(actorUID)
}
