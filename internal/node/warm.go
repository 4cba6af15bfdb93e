package node

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/runtime"
)

// Warm slots. A restore into a slot whose sandbox the runtime made ahead
// of time skips the sandbox's boot (runtime.Runtime.Warm). A warm sandbox
// is made for one workload shape; a restore of any actor of that
// template uses it (the runtime gives the guest its own name), a cold
// boot only of the actor it was made for. When the control plane asks
// (CheckpointRequest.warm: exactly when it records the slot warm, not
// for an eviction), the agent warms a slot for the actor that was just
// suspended or paused out of it, which is warm for the actor and its
// template alike, and (Warm, for TemplateSpec.warm_workers) a free slot
// for a template's next actor, with no actor's name. Warming runs after
// the operation that emptied the slot, under the slot's lock, so it never
// overlaps another operation on the slot; a start that finds the slot
// warm for another workload discards it in the runtime, transparently.
// The slot record remembers the workload while the slot stays free, so
// a restarted agent keeps a warm sandbox it finds (reconcile) or makes
// it again.

// warmTimeout bounds one warm-up.
const warmTimeout = time.Minute

// warmer keeps free slots warm for the actors likely to come back to them.
type warmer struct {
	off bool
	rt  runtime.Runtime
	log *slog.Logger
	// slots are the node's (set when the agent opens them).
	slots []*slot
	// workload is w as a start in s will pass it to the runtime
	// (slotMachine.warmWorkload).
	workload func(ctx context.Context, s *slot, w *torporv1.Workload) (runtime.Workload, error)
	// background runs fn beside the agent's operations: a stopping agent
	// waits for both.
	background func(fn func())
}

// later warms s for w in the background, once the operation holding
// s is over, if s is still free then.
func (wm *warmer) later(ctx context.Context, s *slot, w *torporv1.Workload) {
	if wm.off || isGolden(w) {
		return
	}
	ctx = context.WithoutCancel(ctx)
	wm.background(func() {
		s.lock()
		defer s.unlock()
		ctx, cancel := context.WithTimeout(ctx, warmTimeout)
		defer cancel()
		wm.warm(ctx, s, w)
	})
}

// warm makes s's sandbox ready for w and records it; s is locked. A slot
// that is not free is left alone.
func (wm *warmer) warm(ctx context.Context, s *slot, w *torporv1.Workload) {
	cur := s.current()
	if cur.ActorUID != "" {
		return
	}
	log := wm.log.With("worker", s.name(), "actor_uid", w.GetActorUid())
	began := time.Now()
	rw, err := wm.workload(ctx, s, w)
	if err == nil {
		err = wm.rt.Warm(ctx, s.rt, rw)
	}
	if err != nil {
		// Only speed is lost: the next start boots its own sandbox.
		log.Warn("worker not warmed", "err", err)
		return
	}
	body, err := protojson.Marshal(w)
	if err != nil {
		log.Warn("warm worker not recorded", "err", err)
		return
	}
	cur.Warm = body
	s.stage(cur)
	if err := s.commit(nil); err != nil {
		log.Warn("warm worker not recorded", "err", err)
	}
	log.Debug("worker warm", "took", time.Since(began))
}

// keepOrRewarm settles a free slot at startup: a warm sandbox the previous
// agent made is kept; one recorded but gone is made again.
func (wm *warmer) keepOrRewarm(ctx context.Context, s *slot, present bool) (keep bool) {
	rec := s.current()
	if present {
		st, err := wm.rt.Stats(ctx, s.rt)
		if err == nil && st.Warm && !st.Running {
			wm.log.Info("kept warm sandbox", "worker", s.name())
			return true
		}
		return false
	}
	if len(rec.Warm) > 0 {
		w := &torporv1.Workload{}
		if err := protojson.Unmarshal(rec.Warm, w); err != nil {
			wm.log.Warn("recorded warm workload unreadable; not warming", "worker", s.name(), "err", err)
			return false
		}
		wm.later(ctx, s, w)
	}
	return false
}

// drop removes the warm sandboxes made for actorUID on this node's
// free workers: the actor is terminated, so it is not coming back to
// them. s is locked by the caller; other workers busy with an operation
// are left alone (a start there replaces the sandbox anyway).
func (wm *warmer) drop(ctx context.Context, s *slot, actorUID string) {
	for _, other := range wm.slots {
		if other != s {
			if !other.tryLock() {
				continue
			}
		}
		if cur := other.current(); cur.ActorUID == "" && len(cur.Warm) > 0 && warmFor(cur.Warm) == actorUID {
			if err := wm.unwarm(ctx, other); err != nil {
				wm.log.Warn("warm sandbox of a terminated actor not removed", "worker", other.name(), "actor_uid", actorUID, "err", err)
			}
		}
		if other != s {
			other.unlock()
		}
	}
}

// discard removes every free worker's warm sandbox, keeping its
// record, so a stopped agent leaves no idle process and the next one
// makes the sandbox again (keepOrRewarm). No operation may be running.
func (wm *warmer) discard(ctx context.Context) {
	for _, s := range wm.slots {
		s.lock()
		if cur := s.current(); cur.ActorUID == "" && len(cur.Warm) > 0 {
			if err := wm.rt.Terminate(ctx, s.rt); err != nil {
				wm.log.Warn("warm sandbox not removed", "worker", s.name(), "err", err)
			}
		}
		s.unlock()
	}
}

// unwarm removes free slot s's warm sandbox and forgets it; s is locked.
func (wm *warmer) unwarm(ctx context.Context, s *slot) error {
	if err := wm.rt.Terminate(ctx, s.rt); err != nil {
		return err
	}
	cur := s.current()
	cur.Warm = nil
	s.stage(cur)
	if err := s.commit(nil); err != nil {
		return fmt.Errorf("worker record: %w", err)
	}
	return nil
}

// warmFor returns the actor uid of a recorded warm workload.
func warmFor(body []byte) string {
	w := &torporv1.Workload{}
	if protojson.Unmarshal(body, w) != nil {
		return ""
	}
	return w.GetActorUid()
}

// Warm warms a free worker for a template's next actor, in the
// background (see the NodeAgentService).
func (m *slotMachine) prewarm(ctx context.Context, req *torporv1.WarmRequest) (*torporv1.WarmResponse, error) {
	if err := validateWarm(req); err != nil {
		return nil, err
	}
	s, err := m.slot(req.GetWorker())
	if err != nil {
		return nil, err
	}
	if m.warm.off {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "node %s does not warm workers (warming is off)", m.node)
	}
	if cur := s.current(); cur.ActorUID != "" {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "worker %s hosts actor %s: not warming it for template %s", s.name(), cur.ActorUID, req.GetWorkload().GetTemplateName())
	}
	m.warm.later(ctx, s, req.GetWorkload())
	return &torporv1.WarmResponse{}, nil
}
