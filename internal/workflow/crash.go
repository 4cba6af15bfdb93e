package workflow

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/exits"
	"github.com/torpor-dev/torpor/internal/store"
)

// When a resume fails: the actor crashes, keeping its newest intact state
// (a spoilt snapshot is removed), and a workload the node may have started
// is terminated.

// failResume records a failed resume: the actor becomes CRASHED with the
// reason and its worker is released, unless someone already moved it on.
// A local checkpoint stays the source of the next resume unless the
// failure says it is spoilt (DataLoss): it is the actor's newest state.
// The caller gets the node's error with its code (DataLoss stays DataLoss).
func (e *Engine) failResume(ctx context.Context, a *torporv1.Actor, cause error) error {
	e.terminate(ctx, a)
	op := a.GetStatus().GetOperation()
	var spoilt *torporv1.Snapshot
	err := e.inSameStep(ctx, a, func(tx store.Tx, cur *torporv1.Actor) error {
		reason := "resume failed: " + connectMessage(cause)
		spoilt = nil
		if local := cur.GetStatus().GetLocalCheckpoint(); local != "" && local == op.GetSourceSnapshot() && errors.Is(cause, errdefs.ErrDataLoss) {
			cur.Status.LocalCheckpoint = ""
			var err error
			if spoilt, err = deleteLetGoInTx(ctx, tx, cur, cur.GetMetadata().GetSpace(), local); err != nil {
				return err
			}
			reason += fmt.Sprintf("; local checkpoint %s is unusable and was dropped, with the state it held since the latest durable snapshot", local)
		}
		if exited := exits.Of(cause); exited != nil {
			return e.exitInTx(ctx, tx, cur, exited.GetExit())
		}
		return e.crashInTx(ctx, tx, cur, reason)
	})
	if err != nil {
		e.logger(a).Error("record failed resume", "err", err)
	} else if spoilt != nil {
		e.removeSpoilt(ctx, a, spoilt)
	}
	return cause
}

// removeSpoilt removes the files of the local checkpoint a failed resume
// dropped, once its record is gone: a transaction that ran again and
// found the step moved on deleted nothing, yet kept spoilt from its first
// run.
func (e *Engine) removeSpoilt(ctx context.Context, a *torporv1.Actor, spoilt *torporv1.Snapshot) {
	m := spoilt.GetMetadata()
	_, err := e.store.Snapshots().Get(ctx, m.GetSpace(), m.GetName())
	if errors.Is(err, store.ErrNotFound) {
		err = e.removeSnapshotFiles(ctx, spoilt)
	}
	if err != nil {
		e.logger(a).Warn("remove the unusable local checkpoint", "snapshot", m.GetName(), "err", err)
	}
}

// crashInTx makes cur CRASHED with reason and releases its worker. The
// reason says which state the next resume starts from, so the history
// names what a crash lost.
func (e *Engine) crashInTx(ctx context.Context, tx store.Tx, cur *torporv1.Actor, reason string) error {
	cur.Status.Exit, cur.Status.NextRestartTime = nil, nil
	return e.writeCrash(ctx, tx, cur, reason)
}

// writeCrash is crashInTx keeping what cur's status says of an exit.
func (e *Engine) writeCrash(ctx context.Context, tx store.Tx, cur *torporv1.Actor, reason string) error {
	reason += "; " + keptState(cur)
	t := transition{from: cur.GetStatus().GetState(), to: torporv1.ActorState_ACTOR_STATE_CRASHED, reason: reason, op: cur.GetStatus().GetOperation(), worker: cur.GetStatus().GetWorker()}
	if err := releaseWorker(ctx, tx, t.worker, cur.GetMetadata().GetUid()); err != nil {
		return err
	}
	cur.Status.Worker = nil
	cur.Status.Operation = nil
	cur.Status.CrashReason = reason
	if err := e.setState(cur, torporv1.ActorState_ACTOR_STATE_CRASHED); err != nil {
		return err
	}
	// Its node keeps the log, with the workload's last output (logs reads
	// it there).
	cur.Status.LastWorker = t.worker
	if _, err := tx.Actors().Update(ctx, cur); err != nil {
		return err
	}
	return e.record(ctx, tx, cur.GetMetadata().GetUid(), t)
}

// keptState names the newest state a crashed actor keeps: what its next
// resume starts from.
func keptState(a *torporv1.Actor) string {
	st := a.GetStatus()
	switch {
	case st.GetLocalCheckpoint() != "":
		return "the next resume starts from local checkpoint " + st.GetLocalCheckpoint()
	case st.GetLatestSnapshot() != "":
		return "the next resume starts from snapshot " + st.GetLatestSnapshot()
	}
	return "the actor has no snapshot: the next resume starts it afresh"
}

// terminate asks the node to stop the actor's workload on its worker.
func (e *Engine) terminate(ctx context.Context, a *torporv1.Actor) {
	st := a.GetStatus()
	if st.GetWorker() == nil {
		return
	}
	// Best effort: a node that does not answer drops the workload when it
	// registers again (it is no longer placed there).
	ctx, cancel := context.WithTimeout(ctx, terminateTimeout)
	defer cancel()
	agent, err := e.agents.Agent(ctx, st.GetWorker().GetNode())
	if err != nil {
		e.logger(a).Warn("terminate workload", "err", err)
		return
	}
	e.terminateWorkload(ctx, agent, &torporv1.Operation{
		ActorUid: a.GetMetadata().GetUid(), OperationId: st.GetOperation().GetId() + "-terminate", Worker: st.GetWorker().GetName(),
	})
}

// terminateWorkload stops op's workload; the node only stops a workload
// that belongs to op.ActorUid, so a worker already re-used is safe.
func (e *Engine) terminateWorkload(ctx context.Context, agent NodeAgent, op *torporv1.Operation) {
	if _, err := agent.Terminate(ctx, connect.NewRequest(&torporv1.TerminateRequest{Op: op})); err != nil {
		e.log.Warn("terminate workload", "actor_uid", op.GetActorUid(), "worker", op.GetWorker(), "err", err)
	}
}

// connectMessage is an error's message without the code prefix of a
// status error; a wrapped one keeps its context.
func connectMessage(err error) string {
	if ce, ok := err.(*connect.Error); ok {
		return ce.Message()
	}
	return err.Error()
}
