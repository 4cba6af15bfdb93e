package workflow

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/exits"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
)

// checkpointKind is what distinguishes suspend from pause: where the
// checkpoint goes, with which scope, and the state it ends in.
type checkpointKind struct {
	op     torporv1.OperationKind
	target torporv1.CheckpointTarget
	during torporv1.ActorState
	done   torporv1.ActorState
	scope  func(*torporv1.SnapshotPolicy) torporv1.SnapshotScope
}

var (
	suspendKind = checkpointKind{
		op: torporv1.OperationKind_OPERATION_KIND_SUSPEND, target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE,
		during: torporv1.ActorState_ACTOR_STATE_SUSPENDING, done: torporv1.ActorState_ACTOR_STATE_SUSPENDED,
		scope: (*torporv1.SnapshotPolicy).GetOnCommit,
	}
	pauseKind = checkpointKind{
		op: torporv1.OperationKind_OPERATION_KIND_PAUSE, target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL,
		during: torporv1.ActorState_ACTOR_STATE_PAUSING, done: torporv1.ActorState_ACTOR_STATE_PAUSED,
		scope: (*torporv1.SnapshotPolicy).GetOnPause,
	}
)

// Suspend checkpoints a running actor to snapshot storage (its template's
// onCommit scope) and frees its worker.
func (e *Engine) Suspend(ctx context.Context, space, name string) (*torporv1.Actor, error) {
	return e.checkpoint(ctx, space, name, suspendKind, "")
}

// Pause checkpoints a running actor on its node (onPause scope) and frees
// its worker; the next resume prefers that node.
func (e *Engine) Pause(ctx context.Context, space, name string) (*torporv1.Actor, error) {
	return e.checkpoint(ctx, space, name, pauseKind, "")
}

// checkpoint checkpoints the actor as kind, waiting for a step under way
// first. With onNode set, only while the actor runs there: one that left
// the node meanwhile (a drain's list is older than the resume that moved
// it) is answered as it is, untouched.
func (e *Engine) checkpoint(ctx context.Context, space, name string, kind checkpointKind, onNode string) (a *torporv1.Actor, err error) {
	start := e.now()
	defer func() { e.metrics.observe(kind.metric(), start, err) }()
	for range maxAttempts {
		a, err := e.store.Actors().Get(ctx, space, name)
		if err != nil {
			return nil, err
		}
		switch state := a.GetStatus().GetState(); {
		case state == kind.done:
			return a, nil
		case onWorkerStep(state):
			if err := e.waitForChange(ctx, space, name, a.GetMetadata().GetVersion()); err != nil {
				return nil, err
			}
			continue
		case state == torporv1.ActorState_ACTOR_STATE_RUNNING:
			if onNode != "" && a.GetStatus().GetWorker().GetNode() != onNode {
				return a, nil
			}
		default:
			return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s is %s: only a RUNNING actor can be %s", actorKey(a), enum.Name(state), enum.Name(kind.done))
		}
		claimed, err := e.claimCheckpoint(ctx, a, kind, enum.Name(kind.done)+" requested", nil)
		if errors.Is(err, errRetry) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return e.drive(ctx, claimed, func(ctx context.Context) (*torporv1.Actor, error) { return e.driveCheckpoint(ctx, claimed) })
	}
	return nil, errdefs.Errorf(errdefs.ErrAborted, "actor %s/%s: too many concurrent changes, retry", space, name)
}

// claimCheckpoint commits the SUSPENDING or PAUSING intent of a, with
// reason in its history. evictedFor, when set, is the actor the step
// frees the worker for: the finalize reserves the worker for it.
func (e *Engine) claimCheckpoint(ctx context.Context, a *torporv1.Actor, kind checkpointKind, reason string, evictedFor *torporv1.Actor) (*torporv1.Actor, error) {
	scope := kind.scope(a.GetStatus().GetCurrentTemplateSpec().GetSnapshotPolicy())
	if scope == torporv1.SnapshotScope_SNAPSHOT_SCOPE_UNSPECIFIED {
		scope = torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL
	}
	op := &torporv1.ActorOperation{
		Id:             newOperationID(),
		Kind:           kind.op,
		StartTime:      timestamppb.New(e.now()),
		TargetSnapshot: newSnapshotName(e.now()),
		TargetScope:    scope,
		PreviousState:  a.GetStatus().GetState(),
	}
	if evictedFor != nil {
		op.EvictedFor, op.EvictedForUid = actorKey(evictedFor), evictedFor.GetMetadata().GetUid()
	}
	return e.commitIntent(ctx, a, op, kind.during, reason)
}

// commitIntent commits step op of a, which holds a worker: a moves to
// the step's -ING state with op, compare-and-set on the version read
// (errRetry when it changed), and the history says why.
func (e *Engine) commitIntent(ctx context.Context, a *torporv1.Actor, op *torporv1.ActorOperation, during torporv1.ActorState, reason string) (*torporv1.Actor, error) {
	from := a.GetStatus().GetState()
	a.Status.Operation = op
	if err := e.setState(a, during); err != nil {
		return nil, err
	}
	var claimed *torporv1.Actor
	err := e.store.InTx(ctx, func(tx store.Tx) error {
		var err error
		if claimed, err = tx.Actors().Update(ctx, a); err != nil {
			return err
		}
		return e.record(ctx, tx, a.GetMetadata().GetUid(), transition{from: from, to: during, reason: reason, op: op, worker: a.GetStatus().GetWorker()})
	})
	if errors.Is(err, store.ErrConflict) {
		return nil, errRetry
	}
	return claimed, err
}

func (k checkpointKind) metric() string {
	if k.op == torporv1.OperationKind_OPERATION_KIND_PAUSE {
		return "pause"
	}
	return "suspend"
}

func kindOf(op torporv1.OperationKind) checkpointKind {
	if op == torporv1.OperationKind_OPERATION_KIND_PAUSE {
		return pauseKind
	}
	return suspendKind
}

// driveCheckpoint issues the node call of a committed SUSPENDING or
// PAUSING intent and finalizes it; Recover re-drives it the same way.
func (e *Engine) driveCheckpoint(ctx context.Context, a *torporv1.Actor) (*torporv1.Actor, error) {
	if h := e.hooks.AfterCheckpointClaim; h != nil {
		h(a)
	}
	st, op := a.GetStatus(), a.GetStatus().GetOperation()
	kind := kindOf(op.GetKind())
	space := a.GetMetadata().GetSpace()
	location, err := snapshot.Location(space, a.GetMetadata().GetUid(), op.GetTargetSnapshot())
	if err != nil {
		return nil, e.failCheckpoint(ctx, a, err)
	}
	var resp *connect.Response[torporv1.CheckpointResponse]
	moved, err := e.untilNodeAnswers(ctx, a, func(ctx context.Context) error {
		agent, err := e.agents.Agent(ctx, st.GetWorker().GetNode())
		if err != nil {
			return err
		}
		resp, err = agent.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{
			Op:       &torporv1.Operation{ActorUid: a.GetMetadata().GetUid(), OperationId: op.GetId(), Worker: st.GetWorker().GetName()},
			Scope:    op.GetTargetScope(),
			Target:   kind.target,
			Location: location,
			Warm:     warmsAfter(op),
		}))
		return err
	})
	switch {
	case moved != nil:
		return checkpointedElsewhere(a, moved, kind)
	case err == nil:
	case stillInFlight(ctx, err):
		return nil, err
	default:
		e.logger(a).Warn("checkpoint failed", "err", err)
		return nil, e.failCheckpoint(ctx, a, err)
	}
	if h := e.hooks.BeforeCheckpointFinalize; h != nil {
		h(a)
	}
	snap := &torporv1.Snapshot{
		Metadata:       &torporv1.ObjectMeta{Space: space, Name: op.GetTargetSnapshot()},
		ActorUid:       a.GetMetadata().GetUid(),
		ActorName:      a.GetMetadata().GetName(),
		Scope:          op.GetTargetScope(),
		TemplateUid:    st.GetCurrentTemplateUid(),
		TemplateName:   st.GetCurrentTemplate(),
		TemplateSpec:   st.GetCurrentTemplateSpec(),
		Location:       resp.Msg.GetLocation(),
		ManifestDigest: resp.Msg.GetManifestDigest(),
		SizeBytes:      resp.Msg.GetSizeBytes(),
		HasData:        resp.Msg.GetHasData(),
		OriginNode:     st.GetWorker().GetNode(),
	}
	if kind.target == torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL {
		snap.Node = st.GetWorker().GetNode()
	}
	// finish ends the step in cur and returns the worker it releases.
	finish := func(cur *torporv1.Actor) (*torporv1.WorkerRef, error) {
		if kind.target == torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL {
			cur.Status.LocalCheckpoint = snap.GetMetadata().GetName()
		} else {
			cur.Status.LatestSnapshot = snap.GetMetadata().GetName()
		}
		worker := cur.Status.Worker
		cur.Status.Worker = nil
		cur.Status.Operation = nil
		if err := e.setState(cur, kind.done); err != nil {
			return nil, err
		}
		return worker, nil
	}
	var out, lost *torporv1.Actor
	var expired []*torporv1.Snapshot
	var ret retention
	err = e.endStep(ctx, e.logger(a), func() error {
		var worker *torporv1.Worker
		var err error
		worker, ret, err = e.readForCheckpointEnd(ctx, a, kind, snap)
		if err != nil {
			return err
		}
		return e.store.InTx(ctx, func(tx store.Tx) error {
			out, lost, expired = nil, nil, nil
			end, err := endClaimedStep(ctx, tx, a, finish, func(cur *torporv1.Actor) bool { return checkpointedTo(cur, kind, snap.GetMetadata().GetName()) })
			if err != nil || end.written == nil {
				out, lost = end.done, end.lost
				return err
			}
			written, ref := end.written, end.result
			out = written
			// The record is written only now that the manifest exists
			// (invariant 5), in the transaction that points the actor at
			// it; the previous snapshot stays until this commits.
			if _, err := tx.Snapshots().Create(ctx, snap); err != nil {
				return err
			}
			// The node was asked to keep the worker warm for this actor,
			// and so for any actor of its template (node/warm.go), unless
			// an eviction freed it for another, which it is reserved for
			// and which finds it cold (warmsAfter).
			next := freed{reservedFor: op.GetEvictedForUid(), at: e.now()}
			if warmsAfter(op) {
				next = freed{warmFor: written.GetMetadata().GetUid(), warmTemplate: written.GetStatus().GetCurrentTemplateUid()}
			}
			if err := releaseReadWorker(ctx, tx, ref, written.GetMetadata().GetUid(), worker, next); err != nil {
				return err
			}
			if expired, err = expireInTx(ctx, tx, ret.expire); err != nil {
				return err
			}
			reason := fmt.Sprintf("%s: %s snapshot %s (%d bytes)", enum.Name(kind.done), enum.Name(snap.GetScope()), snap.GetMetadata().GetName(), snap.GetSizeBytes())
			if op.GetEvictedFor() != "" {
				reason += "; worker handed to " + op.GetEvictedFor()
			}
			// Where the node's time went, so a slow suspend can be read
			// off the events like a slow resume.
			if steps := resp.Msg.GetSteps(); len(steps) > 0 {
				reason += "; node " + stepsText(steps)
			}
			return e.record(ctx, tx, written.GetMetadata().GetUid(), transition{
				from: kind.during, to: kind.done, op: op, worker: ref, since: op.GetStartTime().AsTime(), reason: reason,
			})
		})
	})
	if err != nil {
		return nil, fmt.Errorf("finalize %s of actor %s: %w", enum.Name(kind.done), actorKey(a), err)
	}
	if lost != nil {
		return checkpointedElsewhere(a, lost, kind)
	}
	e.metrics.snapshotBytes.WithLabelValues(kind.metric()).Add(float64(snap.GetSizeBytes()))
	// Retention removed the records in the transaction; the files go now
	// that nothing points at them.
	e.removeExpired(ctx, a, ret, expired)
	e.logger(a).Info("actor checkpointed", "state", enum.Name(kind.done), "snapshot", snap.GetMetadata().GetName(), "bytes", snap.GetSizeBytes())
	return out, nil
}

// warmsAfter says whether the checkpoint op asks the node to warm the
// worker it frees for the leaving actor; the finalize records the worker
// warm exactly then. Not for an eviction: the worker is reserved for the
// evicting actor, whose start would discard a sandbox warmed for this one.
func warmsAfter(op *torporv1.ActorOperation) bool {
	return op.GetEvictedForUid() == ""
}

// checkpointedTo reports whether cur is the end of a checkpoint of kind
// into snapshot name.
func checkpointedTo(cur *torporv1.Actor, kind checkpointKind, name string) bool {
	st := cur.GetStatus()
	return st.GetState() == kind.done && (st.GetLatestSnapshot() == name || st.GetLocalCheckpoint() == name)
}

// checkpointedElsewhere is the answer of a checkpoint driver that found
// its step ended by someone else: cur, when that was this checkpoint's
// end (another driver of the same operation finished it), else Aborted.
func checkpointedElsewhere(a, cur *torporv1.Actor, kind checkpointKind) (*torporv1.Actor, error) {
	if cur.GetMetadata().GetUid() == a.GetMetadata().GetUid() && checkpointedTo(cur, kind, a.GetStatus().GetOperation().GetTargetSnapshot()) {
		return cur, nil
	}
	return nil, errdefs.Errorf(errdefs.ErrAborted, "actor %s became %s while checkpointing: %s", actorKey(a), enum.Name(cur.GetStatus().GetState()), cur.GetStatus().GetCrashReason())
}

// failCheckpoint returns the actor to RUNNING when its workload survived
// the failed checkpoint, and makes it CRASHED otherwise: when the node
// says the workload is gone, or the node is lost. Asking the node waits
// for it like any node call of the step.
func (e *Engine) failCheckpoint(ctx context.Context, a *torporv1.Actor, cause error) error {
	running := false
	if !errors.Is(cause, errNodeLost) {
		var stats *connect.Response[torporv1.StatsResponse]
		moved, err := e.untilNodeAnswers(ctx, a, func(ctx context.Context) error {
			agent, err := e.agents.Agent(ctx, a.GetStatus().GetWorker().GetNode())
			if err != nil {
				return err
			}
			stats, err = agent.Stats(ctx, connect.NewRequest(&torporv1.StatsRequest{Worker: a.GetStatus().GetWorker().GetName()}))
			return err
		})
		switch {
		case moved != nil:
			return cause
		case err != nil && stillInFlight(ctx, err):
			return cause // the step stays in flight for Recover
		case err != nil:
			cause = fmt.Errorf("%w; asking whether the workload survived: %w", cause, err)
		default:
			running = stats.Msg.GetRunning() && stats.Msg.GetActorUid() == a.GetMetadata().GetUid()
		}
	}
	op := a.GetStatus().GetOperation()
	err := e.inSameStep(ctx, a, func(tx store.Tx, cur *torporv1.Actor) error {
		reason := fmt.Sprintf("%s failed: %s", enum.Name(kindOf(op.GetKind()).done), connectMessage(cause))
		if exited := exits.Of(cause); exited != nil && !running {
			return e.exitInTx(ctx, tx, cur, exited.GetExit())
		}
		if !running {
			return e.crashInTx(ctx, tx, cur, reason)
		}
		t := transition{from: cur.GetStatus().GetState(), to: torporv1.ActorState_ACTOR_STATE_RUNNING, reason: reason + "; still running", op: op, worker: cur.GetStatus().GetWorker()}
		cur.Status.Operation = nil
		if err := e.setState(cur, torporv1.ActorState_ACTOR_STATE_RUNNING); err != nil {
			return err
		}
		if _, err := tx.Actors().Update(ctx, cur); err != nil {
			return err
		}
		return e.record(ctx, tx, cur.GetMetadata().GetUid(), t)
	})
	if err != nil {
		e.logger(a).Error("record failed checkpoint", "err", err)
	}
	return cause
}

// readForCheckpointEnd reads what the end of a's checkpoint changes
// besides the actor before its transaction, in one round trip, so the
// store's single writer (SQLite) does not wait for the reads: the worker
// (nil when gone; its release compare-and-sets the version read here) and,
// for a checkpoint to storage, what retention needs once latest is
// committed: the actor's snapshots, the tags naming them and the records
// sharing their files.
func (e *Engine) readForCheckpointEnd(ctx context.Context, a *torporv1.Actor, kind checkpointKind, latest *torporv1.Snapshot) (*torporv1.Worker, retention, error) {
	rs := &store.Reads{}
	var workerRead *store.Read[*torporv1.Worker]
	if ref := a.GetStatus().GetWorker(); ref != nil {
		workerRead = store.ReadGet(rs, e.store.Workers(), ref.GetNamespace(), ref.GetName())
	}
	var sharing *store.Read[*torporv1.Snapshot]
	var tags *store.Read[*torporv1.SnapshotTag]
	if kind.target == torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE {
		// The records naming the locations of the actor's snapshots: its
		// snapshots, and forks' or sources' sharing their files.
		sharing = store.ReadAllIn(rs, e.store.Snapshots(), store.ListOptions{}, "location", store.ValuesIn(e.store.Snapshots(), "location", actorSnapshotList(a)))
		tags = store.ReadAllIn(rs, e.store.Tags(), store.ListOptions{Space: a.GetMetadata().GetSpace()}, "snapshot", store.ValuesIn(e.store.Snapshots(), "name", actorSnapshotList(a)))
	}
	if err := rs.Run(ctx); err != nil {
		return nil, retention{}, err
	}
	var worker *torporv1.Worker
	if workerRead != nil {
		var err error
		if worker, err = workerRead.Record(); err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, retention{}, err
		}
	}
	if sharing == nil {
		return worker, retention{}, nil
	}
	ret, err := e.expiring(ctx, a, sharing, tags, latest)
	if err != nil {
		// Retention is not worth failing the step for: the next suspend
		// applies it again.
		e.logger(a).Warn("list snapshots for retention", "err", err)
	}
	return worker, ret, nil
}

// actorSnapshots lists an actor's snapshots, oldest first (names sort by
// creation time).
func (e *Engine) actorSnapshots(ctx context.Context, a *torporv1.Actor) ([]*torporv1.Snapshot, error) {
	return store.ListAll(ctx, e.store.Snapshots(), actorSnapshotList(a))
}

func actorSnapshotList(a *torporv1.Actor) store.ListOptions {
	return store.ListOptions{Space: a.GetMetadata().GetSpace(), Filter: store.Filter{"actor_uid": a.GetMetadata().GetUid()}}
}
