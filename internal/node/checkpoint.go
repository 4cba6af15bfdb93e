package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/retry"
)

// Checkpoints of a running workload: the image staged beside the slot,
// checked, then kept on the node or handed to snapshot storage, and the
// slot settled as the checkpoint left it (running on, or vacated).

// checkpoint captures the slot's workload into a snapshot tree, stores it,
// and frees the slot unless the workload is to keep running.
//
// A capture that ends the workload is put on record first (Capture) and
// staged in a directory named by the operation: if the agent dies
// during it, the sandbox still finishes the capture and exits, and the
// retry of the operation (cur then still records it) goes on from the
// staged capture instead of failing. Storing the capture that meets a
// fault that passes (storage out of reach or not answering, a full disk)
// leaves the same for the retry and answers Unavailable, which is not
// recorded. Nothing a retry would need is discarded before the
// outcome is on record (afterCommit).
func (m *slotMachine) checkpoint(ctx context.Context, s *slot, cur slotRecord, req *torporv1.CheckpointRequest) (*torporv1.CheckpointResponse, error) {
	c, err := m.newCapture(s, cur, req)
	if err != nil {
		return nil, err
	}
	if err := c.recordIntent(); err != nil {
		return nil, err
	}
	c.steps = m.startSteps(ctx, "checkpoint")
	if err := m.capture(ctx, c); err != nil {
		m.abandonCapture(ctx, c)
		return nil, err
	}
	stored, err := m.storeCapture(ctx, c)
	if err != nil {
		return nil, m.storeFailed(ctx, c, err)
	}
	m.settleStored(ctx, c, stored)
	return stored, nil
}

// captureJob is one checkpoint operation on a slot: what it asks for and
// where it stages the capture.
type captureJob struct {
	s   *slot
	req *torporv1.CheckpointRequest
	w   *torporv1.Workload
	// cur is the slot's record when the operation began; running is the
	// record of its workload running on (no capture on record).
	cur, running slotRecord
	opID, stage  string
	leave, full  bool
	// resumed: the capture is an earlier attempt's, on record in cur.
	resumed bool
	// cache: the stored tree belongs in the node's snapshot cache.
	cache bool
	steps *stepTimer
}

func (m *slotMachine) newCapture(s *slot, cur slotRecord, req *torporv1.CheckpointRequest) (*captureJob, error) {
	w, err := cur.workload()
	if err != nil {
		return nil, err
	}
	opID := req.GetOp().GetOperationId()
	running := cur
	running.Phase, running.Capture = phaseRunning, ""
	return &captureJob{
		s: s, req: req, w: w, cur: cur, running: running,
		opID: opID, stage: m.stageDir(cur.ActorUID, opID),
		leave: req.GetLeaveRunning(), full: req.GetScope() == torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		resumed: cur.Capture == opID,
	}, nil
}

// recordIntent prepares the stage directory and puts the capture on the
// slot's record, committed before a capture that ends the workload
// begins (a restarted agent's retry then finds it). An earlier attempt's
// capture is on record already.
func (c *captureJob) recordIntent() error {
	if c.resumed {
		return nil
	}
	if err := emptyDir(c.stage); err != nil {
		return fmt.Errorf("checkpoint of actor %s: stage directory: %w", c.cur.ActorUID, err)
	}
	intent := c.running
	intent.Phase, intent.Capture = phaseStopping, c.opID
	c.s.stage(intent)
	if c.leave {
		return nil
	}
	if err := c.s.commit(nil); err != nil {
		c.s.stage(c.running)
		return errors.Join(err, removeStage(c.stage))
	}
	testHook("recorded")
	return nil
}

// capture makes the capture in the stage directory: the memory image
// (FULL), the workload stopped (unless it keeps running), or an earlier
// attempt's capture awaited and checked.
func (m *slotMachine) capture(ctx context.Context, c *captureJob) error {
	s, w := c.s, c.w
	memory := filepath.Join(c.stage, memoryDir)
	switch {
	case c.resumed:
		// A previous agent's capture: its sandbox is saving itself or
		// gone (reconcile), and may have died before the image was
		// complete.
		if err := m.awaitCapture(ctx, s); err != nil {
			return fmt.Errorf("checkpoint actor %s/%s on worker %s: %w", w.GetSpace(), w.GetActor(), s.name(), err)
		}
		if c.full {
			if err := m.checkImage(memory); err != nil {
				return errdefs.Errorf(errdefs.ErrDataLoss, "checkpoint actor %s/%s: the capture a previous node agent began is incomplete: %w", w.GetSpace(), w.GetActor(), err)
			}
		}
		m.log.Info("going on with the capture of an earlier attempt (cut short by an agent restart or a storage fault)", "worker", s.name(), "actor_uid", c.cur.ActorUID, "operation", c.opID)
	case c.full:
		if err := m.rt.Checkpoint(ctx, s.rt, memory, c.leave); err != nil {
			// A workload that exited cannot be captured: the exit is
			// the failure.
			if exit, ok := s.currentWatch().exitedWithin(exitSettle); ok {
				return exitError(m.describeExit(s, c.cur.ActorUID, exit))
			}
			return fmt.Errorf("checkpoint actor %s/%s on worker %s: %w", w.GetSpace(), w.GetActor(), s.name(), err)
		}
	case !c.leave:
		// Volumes are archived from a stopped workload, so they are
		// consistent.
		if err := m.rt.Terminate(ctx, s.rt); err != nil {
			return fmt.Errorf("stop actor %s/%s on worker %s: %w", w.GetSpace(), w.GetActor(), s.name(), err)
		}
	}
	c.steps.done("capture")
	return nil
}

// storeCapture completes the snapshot tree beside the capture (the
// actor's log, its durable volumes) and stores it at the requested
// target. The capture exists by then: when the workload ended, it is the
// actor's only state.
func (m *slotMachine) storeCapture(ctx context.Context, c *captureJob) (*torporv1.CheckpointResponse, error) {
	w := c.w
	if !c.leave {
		m.logs.detach(c.s.name())
		m.logs.mark(c.cur.ActorUID, "%s (checkpoint %s)", map[bool]string{true: "paused", false: "suspended"}[c.req.GetTarget() == torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL], c.opID)
	}
	if err := m.logs.capture(c.cur.ActorUID, c.stage); err != nil {
		return nil, fmt.Errorf("checkpoint actor %s/%s: its log: %w", w.GetSpace(), w.GetActor(), err)
	}
	c.steps.done("log")
	testHook("captured")
	names := durableVolumes(w.GetTemplate())
	if len(names) > 0 {
		if err := archiveVolumes(m.volumes.dir(c.cur.ActorUID), names, filepath.Join(c.stage, dataArchive)); err != nil {
			return nil, fmt.Errorf("archive volumes of actor %s/%s: %w", w.GetSpace(), w.GetActor(), err)
		}
		c.steps.done("archive")
	}
	digest, size, cache, err := m.snapshots.store(ctx, c.req.GetTarget(), c.req.GetLocation(), c.stage)
	if err != nil {
		return nil, err
	}
	c.cache = cache
	if cache {
		c.steps.done("upload")
	} else {
		c.steps.done("keep")
	}
	testHook("uploaded")
	return &torporv1.CheckpointResponse{Location: c.req.GetLocation(), ManifestDigest: digest, SizeBytes: size, HasData: len(names) > 0, Steps: c.steps.steps}, nil
}

// storeFailed reclassifies a failure to store an existing capture: a
// fault that passes answers Unavailable and, when the workload ended,
// keeps what an agent killed here leaves (see settleCapture): the
// capture on record, its stage directory and the actor's volumes, for
// the repeat of the operation to store. Any other failure settles the
// slot as the capture left it.
func (m *slotMachine) storeFailed(ctx context.Context, c *captureJob, err error) error {
	if !passing(ctx, err) {
		m.abandonCapture(ctx, c)
		return err
	}
	log := m.log.With("worker", c.s.name(), "actor_uid", c.cur.ActorUID, "operation", c.opID)
	err = unavailable(log, fmt.Errorf("checkpoint actor %s/%s: storing the capture: %w", c.w.GetSpace(), c.w.GetActor(), err))
	if c.leave {
		m.abandonCapture(ctx, c)
		return err
	}
	m.identity.pause(c.s.name())
	return err
}

// abandonCapture settles the slot after a failed checkpoint, in its own
// time (the failure may have been the operation running out of it).
func (m *slotMachine) abandonCapture(ctx context.Context, c *captureJob) {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	m.settle(ctx, c.s, c.running, c.stage)
}

// settleStored records the slot as the stored checkpoint left it and,
// once that is on record, caches the snapshot tree and removes what the
// workload left (unless it runs on).
func (m *slotMachine) settleStored(ctx context.Context, c *captureJob, stored *torporv1.CheckpointResponse) {
	s, req, actorUID := c.s, c.req, c.cur.ActorUID
	if c.leave {
		s.stage(c.running)
	} else {
		s.stage(slotRecord{})
	}
	s.afterCommit(func() {
		// A restore on this node then needs no download.
		if c.cache {
			if err := m.snapshots.cache.Add(req.GetLocation(), stored.GetManifestDigest(), c.stage); err != nil {
				m.log.Warn("snapshot not cached", "location", req.GetLocation(), "err", err)
			}
		}
		if err := removeStage(c.stage); err != nil {
			m.log.Warn("checkpoint stage directory not removed", "dir", c.stage, "err", err)
		}
		if c.leave {
			return
		}
		// A local checkpoint is restored here, its log with it; one in
		// storage takes its own.
		if req.GetTarget() == torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL {
			m.logs.close(actorUID)
		} else if err := m.logs.remove(actorUID); err != nil {
			m.log.Warn("actor log not removed", "actor_uid", actorUID, "err", err)
		}
		// The capture stopped the workload already (and detached its log).
		if err := errors.Join(m.hooks().stopped(s), m.removeVolumes(actorUID)); err != nil {
			m.log.Warn("checkpointed workload's remains not removed; the next start removes them", "worker", s.name(), "actor_uid", actorUID, "err", err)
		}
		// The control plane decides: it records the worker warm exactly
		// when it asks.
		if req.GetWarm() {
			m.warm.later(ctx, s, c.w)
		}
	})
	m.log.Debug("checkpoint steps", append([]any{"worker", s.name(), "actor_uid", actorUID, "bytes", stored.GetSizeBytes()}, c.steps.attrs...)...)
}

// testHook is called at the named points of an operation where a test
// kills the agent; it does nothing otherwise.
var testHook = func(point string) {}

// awaitCapture waits for a sandbox that saves itself for a checkpoint
// begun before the agent restarted to exit (it does once saved), and
// removes what it leaves.
func (m *slotMachine) awaitCapture(ctx context.Context, s *slot) error {
	poll := retry.Policy{Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond}.Start()
	for {
		st, err := m.rt.Stats(ctx, s.rt)
		if err != nil {
			return err
		}
		if !st.Running {
			return m.rt.Terminate(ctx, s.rt)
		}
		if !poll.Wait(ctx) {
			return fmt.Errorf("the sandbox is still saving itself: %w", context.Cause(ctx))
		}
	}
}

// stageDir is where checkpoint operation opID of actorUID stages its
// capture: named by the operation, so its retry by a restarted agent
// finds it.
func (m *slotMachine) stageDir(actorUID, opID string) string {
	return filepath.Join(m.workDir, actorUID, opID)
}

// removeStage removes a stage directory and its actor's directory once
// empty.
func removeStage(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Remove(filepath.Dir(dir)); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return err
	}
	return nil
}

// imageChecker is a runtime that can tell a complete memory image from
// one whose capture was cut short.
type imageChecker interface {
	CheckImage(dir string) error
}

func (m *slotMachine) checkImage(dir string) error {
	if c, ok := m.base.(imageChecker); ok {
		return c.CheckImage(dir)
	}
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("memory image: %w", err)
	}
	return nil
}

// settle records what a failed checkpoint left: the workload still
// running (as running), or gone (then the slot is freed; its actor
// resumes elsewhere from its last snapshot).
func (m *slotMachine) settle(ctx context.Context, s *slot, running slotRecord, stage string) {
	if err := removeStage(stage); err != nil {
		m.log.Warn("checkpoint stage directory not removed", "dir", stage, "err", err)
	}
	if st, err := m.rt.Stats(ctx, s.rt); err == nil && st.Running {
		s.stage(running)
		return
	}
	if err := m.vacate(ctx, s, running); err != nil {
		m.log.Error("cleaning up after a failed checkpoint", "worker", s.name(), "actor_uid", running.ActorUID, "err", err)
		return
	}
	m.logs.keep(running.ActorUID, "stopped on node %s, worker %s: the workload was gone at its checkpoint", m.node, s.name())
}
