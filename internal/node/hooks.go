package node

import (
	"context"
	"errors"
	"maps"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// The concerns woven into a slot's lifecycle (the actor's log, its
// workload identity, its local checkpoint) are hooks, after Nomad's task
// runner hooks: the lifecycle calls each phase in one place, and every
// hook that takes part in the phase, in the order of slotMachine.hooks.
// A hook implements only the phases it takes part in.

// slotHook is one concern of the slot lifecycle.
type slotHook interface {
	hookName() string
}

// startingHook prepares for a workload about to boot in s from src,
// returning the mounts it needs in the sandbox. A failure fails the
// start; the slot is then vacated (stoppedHook).
type startingHook interface {
	slotHook
	starting(ctx context.Context, s *slot, w *torporv1.Workload, src bootSource) (mounts map[string]string, err error)
}

// startedHook learns that the runtime started the workload (restored:
// from a memory image), before it is ready.
type startedHook interface {
	slotHook
	started(s *slot, w *torporv1.Workload, restored bool)
}

// runningHook learns that the workload is ready and staged on the slot's
// record as running.
type runningHook interface {
	slotHook
	running(ctx context.Context, s *slot, w *torporv1.Workload)
}

// adoptedHook takes back the workload a previous agent left running in
// s, as started and running gave it to that agent: the restarted agent
// found it running (reconcile), so neither is called for it.
type adoptedHook interface {
	slotHook
	adopted(s *slot, w *torporv1.Workload)
}

// stoppedHook removes what it kept for the slot's workload, which is
// gone.
type stoppedHook interface {
	slotHook
	stopped(s *slot) error
}

// hooks are the lifecycle's hooks, in the order each phase calls them:
// the log first (it is attached before the identity is prepared, and
// detached before the identity is dropped, as the workload's output
// comes before and after it).
func (m *slotMachine) hooks() slotHooks {
	return slotHooks{
		logsHook{logs: m.logs, node: m.node, log: m.log},
		identityHook{identity: m.identity},
		egressHook{g: m.egress},
		snapshotsHook{snapshots: m.snapshots, background: m.ops.Go},
	}
}

type slotHooks []slotHook

func (hs slotHooks) starting(ctx context.Context, s *slot, w *torporv1.Workload, src bootSource) (map[string]string, error) {
	mounts := map[string]string{}
	for _, h := range hs {
		if h, ok := h.(startingHook); ok {
			m, err := h.starting(ctx, s, w, src)
			if err != nil {
				// The hooks' errors name the worker and actor already.
				return nil, err
			}
			maps.Copy(mounts, m)
		}
	}
	return mounts, nil
}

func (hs slotHooks) started(s *slot, w *torporv1.Workload, restored bool) {
	for _, h := range hs {
		if h, ok := h.(startedHook); ok {
			h.started(s, w, restored)
		}
	}
}

func (hs slotHooks) running(ctx context.Context, s *slot, w *torporv1.Workload) {
	for _, h := range hs {
		if h, ok := h.(runningHook); ok {
			h.running(ctx, s, w)
		}
	}
}

func (hs slotHooks) adopted(s *slot, w *torporv1.Workload) {
	for _, h := range hs {
		if h, ok := h.(adoptedHook); ok {
			h.adopted(s, w)
		}
	}
}

// stopped calls every stopped hook, whatever one of them fails.
func (hs slotHooks) stopped(s *slot) error {
	var errs []error
	for _, h := range hs {
		if h, ok := h.(stoppedHook); ok {
			errs = append(errs, h.stopped(s))
		}
	}
	return errors.Join(errs...)
}
