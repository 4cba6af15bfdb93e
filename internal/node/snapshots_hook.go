package node

import (
	"context"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// snapshotsHook drops the local checkpoint a workload started from.
type snapshotsHook struct {
	snapshots *snapshots
	// background runs work an agent's stop waits for.
	background func(func())
}

func (snapshotsHook) hookName() string { return "local checkpoint" }

// running drops the checkpoint only once the start is on record: a
// restart that finds it unrecorded removes the workload, and the retry
// restores it again from its source, which may be a local checkpoint.
func (h snapshotsHook) running(ctx context.Context, s *slot, w *torporv1.Workload) {
	s.afterCommit(func() { h.background(func() { h.snapshots.dropLocal(context.WithoutCancel(ctx), w) }) })
}
