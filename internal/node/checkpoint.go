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
func (m *slotMachine) checkpoint(ctx context.Context, s *slot, cur slotRecord, req *torporv1.CheckpointRequest) (resp *torporv1.CheckpointResponse, err error) {
	w, err := cur.workload()
	if err != nil {
		return nil, err
	}
	opID := req.GetOp().GetOperationId()
	stage := m.stageDir(cur.ActorUID, opID)
	leave, full := req.GetLeaveRunning(), req.GetScope() == torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL
	captured := cur.Capture == opID
	running := cur
	running.Phase, running.Capture = phaseRunning, ""
	if !captured {
		if err := emptyDir(stage); err != nil {
			return nil, fmt.Errorf("checkpoint of actor %s: stage directory: %w", cur.ActorUID, err)
		}
		intent := running
		intent.Phase, intent.Capture = phaseStopping, opID
		s.stage(intent)
		if !leave {
			if err := s.commit(nil); err != nil {
				s.stage(running)
				return nil, errors.Join(err, removeStage(stage))
			}
			testHook("recorded")
		}
	}
	// Set once the capture exists: when the workload ended, it is then
	// the actor's only state.
	capturedNow := false
	defer func() {
		if err == nil {
			return
		}
		transient := capturedNow && passing(ctx, err)
		if transient {
			log := m.log.With("worker", s.name(), "actor_uid", cur.ActorUID, "operation", opID)
			err = unavailable(log, fmt.Errorf("checkpoint actor %s/%s: storing the capture: %w", w.GetSpace(), w.GetActor(), err))
		}
		if transient && !leave {
			// Kept as an agent killed here leaves it (see settleCapture):
			// the capture on record, its stage directory and the actor's
			// volumes, for the repeat of the operation to store.
			m.identity.pause(s.name())
			return
		}
		ctx, cancel := cleanupContext(ctx)
		defer cancel()
		m.settle(ctx, s, running, stage)
	}()

	steps := m.startSteps(ctx, "checkpoint")
	memory := filepath.Join(stage, memoryDir)
	switch {
	case captured:
		// A previous agent's capture: its sandbox is saving itself or
		// gone (reconcile), and may have died before the image was
		// complete.
		if err := m.awaitCapture(ctx, s); err != nil {
			return nil, fmt.Errorf("checkpoint actor %s/%s on worker %s: %w", w.GetSpace(), w.GetActor(), s.name(), err)
		}
		if full {
			if err := m.checkImage(memory); err != nil {
				return nil, errdefs.Errorf(errdefs.ErrDataLoss, "checkpoint actor %s/%s: the capture a previous node agent began is incomplete: %w", w.GetSpace(), w.GetActor(), err)
			}
		}
		m.log.Info("going on with the capture of an earlier attempt (cut short by an agent restart or a storage fault)", "worker", s.name(), "actor_uid", cur.ActorUID, "operation", opID)
	case full:
		if err := m.rt.Checkpoint(ctx, s.rt, memory, leave); err != nil {
			// A workload that exited cannot be captured: the exit is
			// the failure.
			if exit, ok := s.currentWatch().exitedWithin(exitSettle); ok {
				return nil, exitError(m.describeExit(s, cur.ActorUID, exit))
			}
			return nil, fmt.Errorf("checkpoint actor %s/%s on worker %s: %w", w.GetSpace(), w.GetActor(), s.name(), err)
		}
	case !leave:
		// Volumes are archived from a stopped workload, so they are
		// consistent.
		if err := m.rt.Terminate(ctx, s.rt); err != nil {
			return nil, fmt.Errorf("stop actor %s/%s on worker %s: %w", w.GetSpace(), w.GetActor(), s.name(), err)
		}
	}
	steps.done("capture")
	capturedNow = true
	if !leave {
		m.logs.detach(s.name())
		m.logs.mark(cur.ActorUID, "%s (checkpoint %s)", map[bool]string{true: "paused", false: "suspended"}[req.GetTarget() == torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL], opID)
	}
	if err := m.logs.capture(cur.ActorUID, stage); err != nil {
		return nil, fmt.Errorf("checkpoint actor %s/%s: its log: %w", w.GetSpace(), w.GetActor(), err)
	}
	testHook("captured")
	names := durableVolumes(w.GetTemplate())
	if len(names) > 0 {
		if err := archiveVolumes(m.volumes.dir(cur.ActorUID), names, filepath.Join(stage, dataArchive)); err != nil {
			return nil, fmt.Errorf("archive volumes of actor %s/%s: %w", w.GetSpace(), w.GetActor(), err)
		}
		steps.done("archive")
	}
	objects, cache := m.snapshots.target(req.GetTarget())
	digest, size, err := upload(ctx, objects, req.GetLocation(), stage)
	if err != nil {
		return nil, err
	}
	steps.done("upload")
	testHook("uploaded")
	if leave {
		s.stage(running)
	} else {
		s.stage(slotRecord{})
	}
	s.afterCommit(func() {
		// A restore on this node then needs no download.
		if err := cache.Add(req.GetLocation(), digest, stage); err != nil {
			m.log.Warn("snapshot not cached", "location", req.GetLocation(), "err", err)
		}
		if err := removeStage(stage); err != nil {
			m.log.Warn("checkpoint stage directory not removed", "dir", stage, "err", err)
		}
		if leave {
			return
		}
		// A local checkpoint is restored here, its log with it; one in
		// storage takes its own.
		if req.GetTarget() == torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL {
			m.logs.close(cur.ActorUID)
		} else if err := m.logs.remove(cur.ActorUID); err != nil {
			m.log.Warn("actor log not removed", "actor_uid", cur.ActorUID, "err", err)
		}
		// The capture stopped the workload already.
		if err := errors.Join(m.identity.drop(s), m.removeVolumes(cur.ActorUID)); err != nil {
			m.log.Warn("checkpointed workload's remains not removed; the next start removes them", "worker", s.name(), "actor_uid", cur.ActorUID, "err", err)
		}
		m.warm.later(ctx, s, w)
	})
	m.log.Debug("checkpoint steps", append([]any{"worker", s.name(), "actor_uid", cur.ActorUID, "bytes", size}, steps.attrs...)...)
	return &torporv1.CheckpointResponse{Location: req.GetLocation(), ManifestDigest: digest, SizeBytes: size, HasData: len(names) > 0, Steps: steps.steps}, nil
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
	if c, ok := m.rt.(imageChecker); ok {
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
