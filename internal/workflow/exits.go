package workflow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/exits"
	"github.com/torpor-dev/torpor/internal/store"
)

// Exits (DESIGN invariant 11). A node reports a workload whose container
// exited on its own (ReportExit), having freed the worker; a start the
// workload exits during fails with the exit as its detail (failResume),
// as does a checkpoint that finds it gone (failCheckpoint). Each makes the
// actor CRASHED with the exit, and its template's restart policy decides
// whether a restart is due, after a back-off (restartDelay) that
// RestartExited waits out.
const (
	// restartInitial is the back-off before the first restart after an
	// exit; it doubles with each exit in a row, up to restartMax. A
	// restore takes a fraction of a second, so the first restart comes
	// soon; a workload that keeps exiting is retried every few minutes.
	restartInitial = time.Second
	restartMax     = 5 * time.Minute
	// restartReset: a workload that ran this long before it exited
	// starts the count of exits in a row again (as Kubernetes does).
	restartReset = 10 * time.Minute
)

// restartDelay is the back-off before the restart that follows
// `restarts` restarts in a row.
func restartDelay(restarts int32) time.Duration {
	d := restartInitial
	for range restarts {
		if d *= 2; d >= restartMax {
			return restartMax
		}
	}
	return d
}

// restartPolicy is the policy the template gives, defaulted: ALWAYS.
func restartPolicy(spec *torporv1.TemplateSpec) torporv1.RestartPolicy {
	if p := spec.GetRestartPolicy(); p != torporv1.RestartPolicy_RESTART_POLICY_UNSPECIFIED {
		return p
	}
	return torporv1.RestartPolicy_RESTART_POLICY_ALWAYS
}

// restarts says whether policy restarts a workload after exit.
func restarts(policy torporv1.RestartPolicy, exit *torporv1.ContainerExit) bool {
	switch policy {
	case torporv1.RestartPolicy_RESTART_POLICY_NEVER:
		return false
	case torporv1.RestartPolicy_RESTART_POLICY_ON_FAILURE:
		return exits.Failed(exit)
	}
	return true
}

// ReportExit records that the workload of actor actorUID, started by
// operation opID on worker of node, exited: the actor becomes CRASHED
// with the exit (exitInTx) and its worker is released. An exit of a
// workload the actor no longer runs there is ignored; an actor in a step
// meets the exit in that step's node call.
func (e *Engine) ReportExit(ctx context.Context, node, worker, actorUID, opID string, exit *torporv1.ContainerExit) error {
	return e.store.InTx(ctx, func(tx store.Tx) error {
		a, err := e.reportedWorkload(ctx, tx, node, worker, actorUID, opID)
		if a == nil || err != nil {
			return err
		}
		e.logger(a).Warn("workload exited", "exit", exits.Describe(exit))
		return e.exitInTx(ctx, tx, a, exit)
	})
}

// reportedWorkload reads, in tx, the actor a node reports on: actor
// actorUID, RUNNING on worker of node the workload operation opID started.
// nil (and no error) when the report is of a workload the actor no longer
// runs there; FailedPrecondition when worker is not node's.
func (e *Engine) reportedWorkload(ctx context.Context, tx store.Tx, node, worker, actorUID, opID string) (*torporv1.Actor, error) {
	w, err := tx.Workers().Get(ctx, e.opts.WorkerNamespace, worker)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if w.GetSpec().GetNode() != node {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "worker %s is not on node %s", worker, node)
	}
	ref := w.GetStatus().GetActor()
	if ref.GetUid() != actorUID {
		return nil, nil
	}
	a, err := tx.Actors().Get(ctx, ref.GetSpace(), ref.GetName())
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	st := a.GetStatus()
	if a.GetMetadata().GetUid() != actorUID || st.GetWorker().GetUid() != w.GetMetadata().GetUid() ||
		st.GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING || st.GetRunOperation() != "" && st.GetRunOperation() != opID {
		return nil, nil
	}
	return a, nil
}

// exitInTx makes cur CRASHED because its workload exited, recording the
// exit and, when the restart policy restarts it, when: after the
// back-off of its exits in a row.
func (e *Engine) exitInTx(ctx context.Context, tx store.Tx, cur *torporv1.Actor, exit *torporv1.ContainerExit) error {
	st := cur.GetStatus()
	policy := restartPolicy(st.GetCurrentTemplateSpec())
	n := st.GetRestarts()
	if st.GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING && e.now().Sub(st.GetStateTime().AsTime()) >= restartReset {
		n = 0
	}
	reason := exits.Describe(exit)
	st.Exit, st.NextRestartTime = exit, nil
	if restarts(policy, exit) {
		delay := restartDelay(n)
		st.Restarts = n + 1
		st.NextRestartTime = timestamppb.New(e.now().Add(delay))
		reason += fmt.Sprintf("; restart %d in %s (restartPolicy %s)", n+1, delay, enum.Name(policy))
	} else {
		st.Restarts = n
		reason += fmt.Sprintf("; not restarted (restartPolicy %s)", enum.Name(policy))
	}
	return e.writeCrash(ctx, tx, cur, reason)
}

// exitedRefusal is why a resume for traffic (ResumeOptions.OnDemand)
// does not start a's workload, which exited: a restart is due later
// (Unavailable), or its policy does not restart it (FailedPrecondition).
// Nil when the resume may go on: the actor did not crash by an exit, or
// its restart is due.
func (e *Engine) exitedRefusal(a *torporv1.Actor) error {
	st := a.GetStatus()
	if st.GetState() != torporv1.ActorState_ACTOR_STATE_CRASHED || st.GetExit() == nil {
		return nil
	}
	detail := &torporv1.WorkloadExited{Exit: st.GetExit(), NextRestartTime: st.GetNextRestartTime(), RestartPolicy: restartPolicy(st.GetCurrentTemplateSpec())}
	what := "actor " + actorKey(a) + ": " + exits.Describe(st.GetExit())
	if next := st.GetNextRestartTime(); next != nil {
		if wait := next.AsTime().Sub(e.now()); wait > 0 {
			return exits.Error(connect.CodeUnavailable, fmt.Sprintf("%s; restart %d in %s", what, st.GetRestarts(), wait.Round(100*time.Millisecond)), detail)
		}
		return nil
	}
	return exits.Error(connect.CodeFailedPrecondition, fmt.Sprintf("%s; not restarted (restartPolicy %s): resume it to start it again", what, enum.Name(detail.GetRestartPolicy())), detail)
}

// RestartExited restarts the actors whose restart after an exit is due,
// all at once, and waits for them: each is a resume, from the actor's
// newest intact state. One that fails is recorded by the resume (a
// workload that exits again gets the next, longer back-off).
func (e *Engine) RestartExited(ctx context.Context) error {
	crashed, err := store.ListAll(ctx, e.store.Actors(), store.ListOptions{Filter: store.Filter{"state": torporv1.ActorState_ACTOR_STATE_CRASHED.String()}})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(crashed))
	for i, a := range crashed {
		next := a.GetStatus().GetNextRestartTime()
		if next == nil || next.AsTime().After(e.now()) {
			continue
		}
		wg.Go(func() {
			e.logger(a).Info("restarting after an exit", "restart", a.GetStatus().GetRestarts())
			_, err := e.Resume(ctx, a.GetMetadata().GetSpace(), a.GetMetadata().GetName(), ResumeOptions{})
			if err != nil && !errors.Is(err, errdefs.ErrResourceExhausted) && exits.Of(err) == nil {
				errs[i] = fmt.Errorf("restart actor %s: %w", actorKey(a), err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
