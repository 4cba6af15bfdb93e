package workflow

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/torpor-dev/torpor/internal/store"
)

// Frozen actors (IdlePolicy.freeze_seconds): the node freezes and thaws
// a RUNNING actor's sandbox by itself and reports each change, which
// sets or clears status.frozen_time and is recorded as an event. The
// actor stays RUNNING throughout; leaving RUNNING clears the mark
// (setState). Evictions take frozen actors first (evict.go).

// Reasons of the events a freeze and a thaw record.
const (
	FrozenReason = "frozen"
	ThawedReason = "thawed"
)

// ReportFrozen records that the workload a node's worker runs for
// actorUID (started by opID) was frozen or thawed at t. A report for a
// workload the actor no longer runs, or that changes nothing, is
// ignored.
func (e *Engine) ReportFrozen(ctx context.Context, node, worker, actorUID, opID string, frozen bool, t time.Time) error {
	return e.store.InTx(ctx, func(tx store.Tx) error {
		a, err := e.reportedWorkload(ctx, tx, node, worker, actorUID, opID)
		if a == nil || err != nil {
			return err
		}
		st := a.GetStatus()
		if (st.GetFrozenTime() != nil) == frozen {
			return nil
		}
		if t.After(e.now()) {
			t = e.now()
		}
		ev := store.Event{ActorUID: actorUID, Time: t, FromState: st.GetState(), ToState: st.GetState(), OperationID: opID, Worker: e.opts.WorkerNamespace + "/" + worker}
		if frozen {
			st.FrozenTime = timestamppb.New(t)
			ev.Reason = fmt.Sprintf("%s: no traffic, exec or file access for %ds (idle policy freezeSeconds): the sandbox is paused in place, and thaws on the next", FrozenReason, st.GetCurrentTemplateSpec().GetIdlePolicy().GetFreezeSeconds())
		} else {
			ev.Duration = t.Sub(st.GetFrozenTime().AsTime())
			st.FrozenTime = nil
			ev.Reason = ThawedReason + ": traffic, an exec, file access or a stop reached it"
		}
		if _, err := tx.Actors().Update(ctx, a); err != nil {
			return fmt.Errorf("actor %s: record a freeze: %w", actorKey(a), err)
		}
		e.logger(a).Info("actor frozen or thawed", "frozen", frozen, "worker", worker)
		return tx.AppendEvent(ctx, ev)
	})
}
