package node

import (
	"context"
	"log/slog"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// logsHook reads the workload's output into the actor's log while it
// runs, going on from the log its snapshot holds, and marks its start.
type logsHook struct {
	logs *actorLogs
	node string
	log  *slog.Logger
}

func (logsHook) hookName() string { return "actor log" }

// starting restores the snapshot's log (a failure costs the old lines,
// not the start) and attaches to the slot's output before the workload
// writes any.
func (h logsHook) starting(_ context.Context, s *slot, w *torporv1.Workload, src bootSource) (map[string]string, error) {
	if src.logs != "" {
		if err := h.logs.restore(w.GetActorUid(), src.logs); err != nil {
			h.log.Warn("actor log: not restored from the snapshot", "actor_uid", w.GetActorUid(), "err", err)
		}
	}
	h.logs.attach(s.name(), w.GetActorUid(), containerNames(w))
	return nil, nil
}

func (h logsHook) started(s *slot, w *torporv1.Workload, restored bool) {
	if restored {
		h.logs.mark(w.GetActorUid(), "resumed (restored) on node %s, worker %s", h.node, s.name())
		return
	}
	h.logs.mark(w.GetActorUid(), "started (cold boot) on node %s, worker %s", h.node, s.name())
}

// adopted reads the output of a workload a previous agent started from
// where that agent stopped: what it wrote meanwhile waits in its FIFOs.
func (h logsHook) adopted(s *slot, w *torporv1.Workload) {
	h.logs.attach(s.name(), w.GetActorUid(), containerNames(w))
}

// stopped reads what the stopped workload wrote last; the log itself is
// kept, closed or removed by the operation that stopped it.
func (h logsHook) stopped(s *slot) error {
	h.logs.detach(s.name())
	return nil
}
