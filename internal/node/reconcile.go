package node

// Startup. The slot records say what each slot held when the previous
// agent stopped or was killed; the runtime says which sandboxes are left.
// reconcile makes them agree before the agent serves its API, and
// registration (dropOrphans) removes the workloads the control plane gave
// up on meanwhile.

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
	"github.com/torpor-dev/torpor/internal/retry"
	"github.com/torpor-dev/torpor/internal/runtime"
)

// pruneStages removes the checkpoint stage directories of a previous run
// but those of the captures its slot records claim: the retries of the
// others capture again.
func (m *slotMachine) pruneStages() error {
	claimed := map[string]bool{}
	for _, s := range m.slots {
		if rec := s.current(); rec.Capture != "" {
			claimed[m.stageDir(rec.ActorUID, rec.Capture)] = true
		}
	}
	actors, err := os.ReadDir(m.workDir)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	var errs []error
	for _, actor := range actors {
		dir := filepath.Join(m.workDir, actor.Name())
		stages, _ := os.ReadDir(dir)
		for _, st := range stages {
			if path := filepath.Join(dir, st.Name()); !claimed[path] {
				errs = append(errs, os.RemoveAll(path))
			}
		}
		if err := os.Remove(dir); err != nil && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("state directory: checkpoint stages: %w", err)
	}
	return nil
}

// reconcile makes the runtime's sandboxes agree with the slot records: a
// workload recorded running is adopted, a capture recorded begun is
// adopted as running if its sandbox still runs and kept for its retry
// otherwise, and anything else (an operation cut short by a crash, a
// sandbox no record knows) is removed, with its volumes.
func (m *slotMachine) reconcile(ctx context.Context) error {
	names, err := m.rt.Sandboxes(ctx)
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	present := map[string]bool{}
	for _, n := range names {
		present[n] = true
	}
	for _, s := range m.slots {
		rec := s.current()
		if last := rec.LastOp; last != nil {
			if j, err := m.journal.get(last.key()); err == nil && j == nil {
				if err := m.journal.put(last); err != nil {
					return err
				}
			}
		}
		log := m.log.With("worker", s.name(), "actor_uid", rec.ActorUID, "phase", string(rec.Phase))
		switch {
		case rec.Phase == phaseRunning && present[s.name()]:
			log.Info("adopted running workload", "operation", rec.Operation)
			m.adopt(s, rec)
		case rec.Capture != "":
			if err := m.settleCapture(ctx, s, rec, present[s.name()]); err != nil {
				return err
			}
		case rec.ActorUID != "":
			log.Warn("workload did not survive the agent's restart; removing it")
			m.clearOrQuarantine(ctx, s, func(ctx context.Context) error {
				if err := m.vacate(ctx, s, rec); err != nil {
					return err
				}
				return s.commit(nil)
			})
		case m.warm.keepOrRewarm(ctx, s, present[s.name()]):
		case present[s.name()]:
			log.Warn("removing a sandbox no record knows")
			m.clearOrQuarantine(ctx, s, func(ctx context.Context) error { return m.rt.Terminate(ctx, s.rt) })
		}
		delete(present, s.name())
	}
	for name := range present {
		m.log.Warn("removing the sandbox of a worker this node no longer has", "worker", name)
		if err := m.rt.Terminate(ctx, runtime.Slot{Name: name}); err != nil {
			// No worker takes actors there: what is left waits for the
			// next start, and the node serves meanwhile.
			m.log.Error("could not remove the sandbox of a worker this node no longer has", "worker", name, "err", err)
		}
	}
	hosted := map[string]bool{}
	for _, s := range m.slots {
		hosted[s.current().ActorUID] = true
	}
	return m.volumes.removeStrays(hosted)
}

// adopt takes back the workload rec records running in s, which a
// previous agent started and the runtime still runs: every hook's
// adopted (its log read, its identity renewed) and its exit followed.
// Each way reconcile finds a workload to adopt goes through here.
func (m *slotMachine) adopt(s *slot, rec slotRecord) {
	if w, err := rec.workload(); err != nil {
		m.log.Error("adopted workload's output will not be read nor its certificate renewed", "worker", s.name(), "actor_uid", rec.ActorUID, "err", err)
	} else {
		m.hooks().adopted(s, w)
	}
	m.follow(s, rec, m.watch(s))
}

// clearOrQuarantine clears slot s of what a previous run left with clear.
// A slot it fails on is held out of service, not registered as a worker,
// while clear is retried in the background: one slot the runtime cannot
// clean must not keep the node, and every workload it adopted, from
// serving. The slot comes back, registered again, once clear succeeds.
func (m *slotMachine) clearOrQuarantine(ctx context.Context, s *slot, clear func(context.Context) error) {
	err := clear(ctx)
	if err == nil {
		return
	}
	log := m.log.With("worker", s.name())
	log.Error("worker held out of service: what the previous run left in it cannot be removed; retrying", "err", err)
	s.outOfService.Store(true)
	s.lock()
	// Owned by ops: the agent's stop ends ctx, then waits for it.
	m.ops.Go(func() {
		defer s.unlock()
		backoff := quarantineRetry.Start()
		for backoff.Wait(ctx) {
			if err := clear(ctx); err != nil {
				log.Warn("worker still out of service", "err", err)
				continue
			}
			s.outOfService.Store(false)
			log.Info("worker back in service")
			if m.slotsChanged != nil {
				m.slotsChanged()
			}
			return
		}
	})
}

// quarantineRetry paces the cleaning of a slot held out of service; it
// never gives up while the agent runs.
var quarantineRetry = retry.Policy{Initial: time.Second, Max: time.Minute}

// settleCapture settles a slot whose checkpoint operation began before
// the agent restarted: a sandbox still running that has not begun saving
// itself never will, so the workload is adopted and the retry captures
// again; a sandbox saving itself, or gone (it finished or abandoned the
// capture), leaves the slot to the retry to go on from the stage
// directory (or to a Terminate, or registration finding the actor placed
// elsewhere, to remove), with the actor's volumes.
func (m *slotMachine) settleCapture(ctx context.Context, s *slot, rec slotRecord, present bool) error {
	log := m.log.With("worker", s.name(), "actor_uid", rec.ActorUID, "operation", rec.Capture)
	if present {
		st, err := m.rt.Stats(ctx, s.rt)
		if err != nil {
			return fmt.Errorf("worker %s: %w", s.name(), err)
		}
		if st.Running && !captureBegun(m.stageDir(rec.ActorUID, rec.Capture)) {
			rec.Phase, rec.Capture = phaseRunning, ""
			s.stage(rec)
			if err := s.commit(nil); err != nil {
				return err
			}
			log.Info("adopted a workload whose checkpoint was cut short; its retry captures it again")
			m.adopt(s, rec)
			return nil
		}
		if st.Running {
			log.Info("the workload is saving itself for a checkpoint cut short; kept for its retry")
			return nil
		}
		// What a sandbox that captured itself leaves.
		if err := m.rt.Terminate(ctx, s.rt); err != nil {
			return fmt.Errorf("worker %s: remove the sandbox that checkpointed actor %s: %w", s.name(), rec.ActorUID, err)
		}
	}
	log.Info("kept the capture of a checkpoint cut short for its retry")
	return nil
}

// captureBegun says whether the sandbox began writing its memory image
// into stage: runsc creates the image files empty before it asks the
// sandbox to save itself.
func captureBegun(stage string) bool {
	files, _ := os.ReadDir(filepath.Join(stage, memoryDir))
	for _, f := range files {
		if fi, err := f.Info(); err == nil && fi.Size() > 0 {
			return true
		}
	}
	return false
}

// dropOrphans removes the workloads of slots (locked by the caller) that
// the control plane no longer places on their worker: it gave up on them
// while this node was out of touch (the actor crashed and may run
// elsewhere by now), and would otherwise find the worker busy forever. A
// worker returned without a status (a registry that does not track
// placement) says nothing.
func (m *slotMachine) dropOrphans(ctx context.Context, slots []*slot, workers []*torporv1.Worker) {
	placed := map[string]*torporv1.WorkerStatus{}
	for _, w := range workers {
		placed[w.GetMetadata().GetName()] = w.GetStatus()
	}
	for _, s := range slots {
		cur, status := s.current(), placed[s.name()]
		if cur.ActorUID == "" || status == nil || status.GetActor().GetUid() == cur.ActorUID {
			continue
		}
		m.log.Warn("the control plane no longer places this workload here; removing it", "worker", s.name(), "actor_uid", cur.ActorUID, "placed", status.GetActor().GetUid())
		err := m.vacate(ctx, s, cur)
		if err == nil {
			err = s.commit(nil)
		}
		if err != nil {
			m.log.Error("removing an orphaned workload", "worker", s.name(), "actor_uid", cur.ActorUID, "err", err)
		}
	}
}
