package workflow

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/scheduler"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/tracing"
	"github.com/torpor-dev/torpor/internal/validate"
)

// ResumeOptions change where a resume takes the actor's state from.
type ResumeOptions struct {
	// Boot cold-boots an actor without state instead of restoring its
	// template's golden snapshot.
	Boot bool
	// Snapshot restores this kept snapshot of the actor instead of the
	// latest one.
	Snapshot string
	// AllowStateLoss accepts restoring a snapshot under a template revision
	// that loses some of its state (CheckMove).
	AllowStateLoss bool
	// Repeat: the caller asks again after a refusal for lack of workers;
	// another such refusal is not counted again.
	Repeat bool
	// OnDemand: the resume is for traffic (a router's). An actor whose
	// workload exited is left to its restart policy (exitedRefusal).
	OnDemand bool
}

// Resume brings the actor to RUNNING on a free worker. A RUNNING actor is
// returned at once without a write; a step in flight is waited for.
func (e *Engine) Resume(ctx context.Context, space, name string, opts ResumeOptions) (a *torporv1.Actor, err error) {
	if err := e.refuseWhileStopping(space, name); err != nil {
		return nil, err
	}
	start := e.now()
	ctx, span := tracing.Start(ctx, "workflow.resume", attribute.String("actor", space+"/"+name))
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	defer func() {
		refused := errors.Is(err, errdefs.ErrResourceExhausted)
		if refused && !opts.Repeat {
			e.metrics.noEvictable.Inc()
		}
		if !refused || !opts.Repeat {
			e.metrics.observe("resume", start, err)
		}
	}()
	evicted := false
	for range maxAttempts {
		reads, err := e.readForResume(ctx, space, name, opts)
		if err != nil {
			return nil, err
		}
		a, err := reads.actor.Record()
		if err != nil {
			return nil, err
		}
		switch state := a.GetStatus().GetState(); {
		case state == torporv1.ActorState_ACTOR_STATE_RUNNING:
			if opts.Snapshot != "" {
				return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s is RUNNING: suspend it before restoring snapshot %s", actorKey(a), opts.Snapshot)
			}
			// Asking for a running actor keeps it alive; one resumed
			// now is active since it became RUNNING (ActivityOf).
			e.touch(ctx, a)
			return a, nil
		case onWorkerStep(state):
			if err := e.waitForChange(ctx, space, name, a.GetMetadata().GetVersion()); err != nil {
				return nil, err
			}
			continue
		case state == torporv1.ActorState_ACTOR_STATE_DELETING:
			return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s is being deleted", actorKey(a))
		}
		if opts.OnDemand {
			if err := e.exitedRefusal(a); err != nil {
				return nil, err
			}
		}
		claimCtx, claimSpan := tracing.Start(ctx, "workflow.claim")
		claimed, src, err := e.claimResume(claimCtx, a, reads, opts)
		claimSpan.End()
		if errors.Is(err, errRetry) {
			continue
		}
		// One eviction per resume: the worker it frees is reserved for
		// this actor, so a second would take more than it needs.
		var full *noFreeWorker
		if errors.As(err, &full) && !evicted {
			evictCtx, evictSpan := tracing.Start(ctx, "workflow.evict")
			err := e.evictFor(evictCtx, a, full)
			evictSpan.End()
			if err != nil {
				return nil, err
			}
			evicted = true
			continue
		}
		if err != nil {
			return nil, err
		}
		span.SetAttributes(attribute.String("restore", enum.Name(claimed.GetStatus().GetOperation().GetRestoreScope())),
			attribute.String("template", claimed.GetStatus().GetOperation().GetTemplate()))
		return e.drive(ctx, claimed, func(ctx context.Context) (*torporv1.Actor, error) { return e.driveResume(ctx, claimed, src) })
	}
	return nil, errdefs.Errorf(errdefs.ErrAborted, "actor %s/%s: too many concurrent changes, retry", space, name)
}

// source is where a resume's state comes from.
type source struct {
	kind SourceKind
	snap *torporv1.Snapshot
	// requireNode: a local checkpoint can only be restored on its node.
	requireNode string
	// note explains a fallback in the actor's history.
	note string
}

// resumeSource decides where a's state comes from, given which nodes are
// live and the records of the snapshots it names.
func resumeSource(a *torporv1.Actor, opts ResumeOptions, live func(string) bool, snapshot func(name string) (*torporv1.Snapshot, error)) (source, error) {
	st := a.GetStatus()
	if opts.Snapshot != "" {
		snap, err := snapshot(opts.Snapshot)
		if err != nil {
			return source{}, err
		}
		if snap.GetActorUid() != a.GetMetadata().GetUid() {
			return source{}, errdefs.Errorf(errdefs.ErrInvalidArgument, "snapshot %s belongs to another actor, not %s", opts.Snapshot, actorKey(a))
		}
		if snap.GetNode() != "" {
			return source{kind: SourceLocal, snap: snap, requireNode: snap.GetNode()}, nil
		}
		return source{kind: SourceDurable, snap: snap, note: "snapshot " + opts.Snapshot + " asked for"}, nil
	}
	// The local checkpoint, when there is one, is the actor's newest
	// state: a PAUSED actor's, or a CRASHED one's whose resume from it
	// failed for a reason that did not spoil it.
	var note string
	if st.GetLocalCheckpoint() != "" {
		snap, err := snapshot(st.GetLocalCheckpoint())
		switch {
		case err == nil && live(snap.GetNode()):
			return source{kind: SourceLocal, snap: snap, requireNode: snap.GetNode()}, nil
		case err == nil:
			note = fmt.Sprintf("node %s holding the local checkpoint is gone; using the latest durable snapshot", snap.GetNode())
		case errors.Is(err, store.ErrNotFound):
			note = "local checkpoint record is gone; using the latest durable snapshot"
		default:
			return source{}, err
		}
	}
	if st.GetLatestSnapshot() == "" {
		return source{kind: SourceNone, note: note}, nil
	}
	snap, err := snapshot(st.GetLatestSnapshot())
	if errors.Is(err, store.ErrNotFound) {
		return source{}, errdefs.Errorf(errdefs.ErrDataLoss, "actor %s: its latest snapshot %s has no record", actorKey(a), st.GetLatestSnapshot())
	}
	if err != nil {
		return source{}, err
	}
	return source{kind: SourceDurable, snap: snap, note: note}, nil
}

// claimResume decides the restore and commits the RESUMING intent together
// with the worker claim, in one transaction. The actor's version guards the
// claim: a concurrent repoint or resume makes it fail and start over, so the
// template and snapshot read with a are the ones the claim is based on. It
// returns the claimed actor and the source snapshot's record, when the
// restore uses one (records are immutable: the node call can use it as is).
func (e *Engine) claimResume(ctx context.Context, a *torporv1.Actor, reads *resumeReads, opts ResumeOptions) (*torporv1.Actor, *torporv1.Snapshot, error) {
	space := a.GetMetadata().GetSpace()
	revision := validate.RevisionName(a.GetSpec().GetTemplate(), a.GetSpec().GetTemplateRevision())
	tmpl, err := reads.template(revision)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s: template %s/%s does not exist", actorKey(a), space, revision)
	}
	if err != nil {
		return nil, nil, err
	}
	nodes, err := reads.nodes.Records()
	if err != nil {
		return nil, nil, err
	}
	live := e.liveIn(nodes)
	src, err := resumeSource(a, opts, live, reads.snapshot)
	if err != nil {
		return nil, nil, err
	}
	if err := checkResumeSource(a, &src, tmpl, opts); err != nil {
		return nil, nil, err
	}
	golden := ""
	if tmpl.GetStatus().GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_READY {
		golden = tmpl.GetStatus().GetGoldenSnapshot()
	}
	plan := DecideRestore(RestoreInput{
		Source:            src.kind,
		SourceScope:       src.snap.GetScope(),
		SourceTemplateUID: src.snap.GetTemplateUid(),
		ActorTemplateUID:  tmpl.GetMetadata().GetUid(),
		SameGuest:         SameGuest(src.snap.GetTemplateSpec(), tmpl.GetSpec()),
		FromData:          tmpl.GetSpec().GetSnapshotPolicy().GetOnResume().GetFromData(),
		Golden:            golden,
		ForceBoot:         opts.Boot,
		NoGolden:          a.GetSpec().GetSandbox() != nil,
	})
	free, err := reads.free.Records()
	if err != nil {
		return nil, nil, err
	}
	if golden == "" && a.GetSpec().GetSandbox() == nil && (plan.Scope == torporv1.RestoreScope_RESTORE_SCOPE_BOOT && !opts.Boot ||
		plan.Scope == torporv1.RestoreScope_RESTORE_SCOPE_DATA && tmpl.GetSpec().GetSnapshotPolicy().GetOnResume().GetFromData() == torporv1.FromData_FROM_DATA_GOLDEN) {
		src.note = joinNotes(src.note, fmt.Sprintf("cold boot: the golden snapshot of %s is not ready (%s)", revision, phaseName(tmpl.GetStatus().GetPhase())))
	}
	placeable := e.placeableIn(nodes, src.requireNode)
	w, picked, err := e.claiming.pick(func(claiming func(*torporv1.Worker) bool) (*torporv1.Worker, error) {
		return scheduler.Pick(free, placeable, scheduler.Request{
			SandboxClass: tmpl.GetSpec().GetSandboxClass(),
			Selector:     a.GetSpec().GetWorkerSelector(),
			RequireNode:  src.requireNode,
			CachedOn:     cachedOn(src, plan),
			WarmFor:      a.GetMetadata().GetUid(),
			WarmTemplate: warmTemplate(plan, tmpl),
			Now:          e.now(),
			Claiming:     claiming,
		})
	})
	var noWorker *scheduler.NoWorkerError
	if errors.As(err, &noWorker) {
		return nil, nil, &noFreeWorker{live: placeable, req: scheduler.Request{
			SandboxClass: tmpl.GetSpec().GetSandboxClass(), Selector: a.GetSpec().GetWorkerSelector(), RequireNode: src.requireNode,
		}, cause: err, err: errdefs.Errorf(errdefs.ErrResourceExhausted, "actor %s: %v", actorKey(a), err)}
	}
	if err != nil {
		return nil, nil, err
	}
	defer picked()

	from := a.GetStatus().GetState()
	op := &torporv1.ActorOperation{
		Id:             newOperationID(),
		Kind:           torporv1.OperationKind_OPERATION_KIND_RESUME,
		StartTime:      timestamppb.New(e.now()),
		RestoreScope:   plan.Scope,
		GoldenSnapshot: plan.Golden,
		Template:       revision,
		TemplateUid:    tmpl.GetMetadata().GetUid(),
		PreviousState:  from,
	}
	if plan.UseSource {
		op.SourceSnapshot = src.snap.GetMetadata().GetName()
	}
	st := a.Status
	st.Operation = op
	st.Worker = &torporv1.WorkerRef{
		Namespace: w.GetMetadata().GetSpace(), Name: w.GetMetadata().GetName(), Uid: w.GetMetadata().GetUid(),
		Node: w.GetSpec().GetNode(), Ip: w.GetSpec().GetIp(), Gate: w.GetSpec().GetGate(),
	}
	// The guest about to run is built on this template (invariant 8).
	st.CurrentTemplate = revision
	st.CurrentTemplateUid = tmpl.GetMetadata().GetUid()
	st.CurrentTemplateSpec = tmpl.GetSpec()
	renewLeaseOnResume(a, e.now())
	if err := e.setState(a, torporv1.ActorState_ACTOR_STATE_RESUMING); err != nil {
		return nil, nil, err
	}
	w.Status.Actor = &torporv1.ActorRef{Space: space, Name: a.GetMetadata().GetName(), Uid: a.GetMetadata().GetUid()}
	w.Status.WarmActorUid, w.Status.WarmTemplateUid, w.Status.ReservedForActorUid, w.Status.ReserveTime = "", "", "", nil

	if h := e.hooks.BeforeResumeClaim; h != nil {
		h(a)
	}
	var claimed *torporv1.Actor
	err = e.store.InTx(ctx, func(tx store.Tx) error {
		if _, err := tx.Workers().Update(ctx, w); err != nil {
			return err
		}
		var err error
		if claimed, err = tx.Actors().Update(ctx, a); err != nil {
			return err
		}
		return e.record(ctx, tx, a.GetMetadata().GetUid(), transition{
			from: from, to: torporv1.ActorState_ACTOR_STATE_RESUMING, reason: describePlan(plan, src), op: op, worker: st.Worker,
		})
	})
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
		return nil, nil, errRetry
	}
	if err != nil {
		return nil, nil, fmt.Errorf("claim worker %s for actor %s: %w", w.GetMetadata().GetName(), actorKey(a), err)
	}
	if !plan.UseSource {
		return claimed, nil, nil
	}
	return claimed, src.snap, nil
}

// checkResumeSource refuses to restore a source captured under another
// template revision than tmpl when that loses state (CheckMove) and the loss
// was not accepted, by this request or by the move that led here (recorded
// on the actor for exactly this snapshot and revision). An actor without
// state cannot start on a revision whose golden build failed. An accepted
// loss is noted in the source, so the history says what was lost.
func checkResumeSource(a *torporv1.Actor, src *source, tmpl *torporv1.Template, opts ResumeOptions) error {
	if src.kind == SourceNone {
		if !opts.Boot {
			return Usable(tmpl)
		}
		return nil
	}
	if src.snap.GetTemplateUid() == tmpl.GetMetadata().GetUid() {
		return nil
	}
	loss, err := CheckMove(src.snap, tmpl)
	if err != nil {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s: %s %s was captured under %s and cannot be restored under %s: %v",
			actorKey(a), src.kind, src.snap.GetMetadata().GetName(), src.snap.GetTemplateName(), tmpl.GetMetadata().GetName(), err)
	}
	if loss == "" {
		return nil
	}
	accepted := a.GetStatus().GetAcceptedStateLoss()
	if !opts.AllowStateLoss && (accepted.GetSnapshot() != src.snap.GetMetadata().GetName() || accepted.GetTemplateUid() != tmpl.GetMetadata().GetUid()) {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s: restoring %s %s (captured under %s) under %s loses state: %s; resume with --allow-state-loss to accept that",
			actorKey(a), src.kind, src.snap.GetMetadata().GetName(), src.snap.GetTemplateName(), tmpl.GetMetadata().GetName(), loss)
	}
	src.note = joinNotes(src.note, "state loss accepted: "+loss)
	return nil
}

func joinNotes(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// cachedOn names the nodes likely to hold the plan's snapshots in their
// cache: the nodes that wrote them.
func cachedOn(src source, plan RestorePlan) []string {
	if src.snap == nil || !plan.UseSource || src.snap.GetOriginNode() == "" {
		return nil
	}
	return []string{src.snap.GetOriginNode()}
}

func describePlan(plan RestorePlan, src source) string {
	s := "resume: " + enum.Name(plan.Scope)
	if src.snap != nil && plan.UseSource {
		s += " from " + src.kind.String() + " " + src.snap.GetMetadata().GetName()
	}
	if plan.Golden != "" {
		s += " on golden " + plan.Golden
	}
	if plan.DiscardsMemory {
		s += "; the snapshot's memory was captured under another template and is discarded"
	}
	if src.note != "" {
		s += "; " + src.note
	}
	return s
}

// driveResume issues the node call of a committed RESUMING intent and
// finalizes it. It is also how Recover finishes a resume a crashed control
// plane left behind: the node call is idempotent on the operation id.
// source, when not nil, is the record of the operation's source snapshot
// as the claim read it.
func (e *Engine) driveResume(ctx context.Context, a *torporv1.Actor, source *torporv1.Snapshot) (*torporv1.Actor, error) {
	if h := e.hooks.AfterResumeClaim; h != nil {
		h(a)
	}
	st, op := a.GetStatus(), a.GetStatus().GetOperation()
	log := e.logger(a)
	var res restored
	nodeStart := e.now()
	nodeCtx, nodeSpan := tracing.Start(ctx, "workflow.node", attribute.String("node", st.GetWorker().GetNode()), attribute.String("worker", st.GetWorker().GetName()))
	moved, err := e.untilNodeAnswers(nodeCtx, a, func(ctx context.Context) (err error) {
		res, err = e.callRestore(ctx, a, source)
		return err
	})
	nodeSpan.End()
	res.claim, res.node = nodeStart.Sub(op.GetStartTime().AsTime()), e.now().Sub(nodeStart)
	switch {
	case moved != nil:
		return resumedElsewhere(a, moved)
	case err == nil:
	case stillInFlight(ctx, err):
		return nil, err
	default:
		log.Warn("resume failed", "err", err)
		return nil, e.failResume(ctx, a, err)
	}
	if h := e.hooks.BeforeResumeFinalize; h != nil {
		h(a)
	}
	// finish makes cur RUNNING and returns the local checkpoint it moved
	// past: any resume does.
	finish := func(cur *torporv1.Actor) (local string, err error) {
		local = cur.Status.LocalCheckpoint
		cur.Status.LocalCheckpoint = ""
		cur.Status.CrashReason = ""
		cur.Status.Exit, cur.Status.NextRestartTime = nil, nil
		if err := e.setState(cur, torporv1.ActorState_ACTOR_STATE_RUNNING); err != nil {
			return "", err
		}
		cur.Status.RestoredBy = op.GetRestoreScope()
		cur.Status.RunOperation, cur.Status.Egress = op.GetId(), res.egress
		cur.Status.Operation = nil
		return local, nil
	}
	var out *torporv1.Actor
	var lost *torporv1.Actor
	finalizeStart := e.now()
	defer func() { tracing.Phase(ctx, "workflow.finalize", finalizeStart, e.now()) }()
	err = e.endStep(ctx, e.logger(a), func() error {
		return e.store.InTx(ctx, func(tx store.Tx) error {
			out, lost = nil, nil
			end, err := endClaimedStep(ctx, tx, a, finish, func(cur *torporv1.Actor) bool { return runningOn(cur, st.GetWorker()) })
			if err != nil || end.written == nil {
				out, lost = end.done, end.lost
				return err
			}
			written, local := end.written, end.result
			out = written
			if local != "" {
				if _, err := deleteLetGoInTx(ctx, tx, written, written.GetMetadata().GetSpace(), local); err != nil {
					return err
				}
			}
			return e.record(ctx, tx, written.GetMetadata().GetUid(), transition{
				from: torporv1.ActorState_ACTOR_STATE_RESUMING, to: torporv1.ActorState_ACTOR_STATE_RUNNING,
				reason: resumedReason(op, res), op: op, worker: written.GetStatus().GetWorker(), since: op.GetStartTime().AsTime(),
			})
		})
	})
	if err == nil && lost != nil {
		// A crash (or another writer) moved the actor on while the node was
		// restoring: never write RUNNING over it (invariant 2), and stop the
		// workload it no longer owns.
		e.terminate(ctx, a)
		return resumedElsewhere(a, lost)
	}
	if err != nil {
		return nil, fmt.Errorf("finalize resume of actor %s: %w", actorKey(a), err)
	}
	log.Info("actor running", "duration", e.now().Sub(op.GetStartTime().AsTime()))
	return out, nil
}

// runningOn reports whether cur is RUNNING on worker: the end of a resume
// that claimed worker.
func runningOn(cur *torporv1.Actor, worker *torporv1.WorkerRef) bool {
	return cur.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING && cur.GetStatus().GetWorker().GetUid() == worker.GetUid()
}

// resumedElsewhere is the answer of a resume driver that found its step
// ended by someone else: cur, when that was this resume's end (another
// driver of the same operation finished it), else Aborted.
func resumedElsewhere(a, cur *torporv1.Actor) (*torporv1.Actor, error) {
	if cur.GetMetadata().GetUid() == a.GetMetadata().GetUid() && runningOn(cur, a.GetStatus().GetWorker()) {
		return cur, nil
	}
	return nil, errdefs.Errorf(errdefs.ErrAborted, "actor %s became %s while resuming: %s", actorKey(a), enum.Name(cur.GetStatus().GetState()), cur.GetStatus().GetCrashReason())
}

// restored is how a resume's node call went, for the actor's history.
type restored struct {
	// warm: the workload started in a sandbox the node made ahead.
	warm bool
	// steps are the node's, in order (none for a cold boot).
	steps []*torporv1.StepDuration
	// claim is from the operation's start (its claim) to the node call;
	// node is the node call, retries included.
	claim, node time.Duration
	// egress is the policy the workload started under (ActorStatus.egress).
	egress *torporv1.EgressPolicy
}

// callRestore asks the node to start a's workload, reporting whether it
// started in a sandbox the node made ahead and the node's steps.
func (e *Engine) callRestore(ctx context.Context, a *torporv1.Actor, source *torporv1.Snapshot) (restored, error) {
	st, op := a.GetStatus(), a.GetStatus().GetOperation()
	agent, err := e.agents.Agent(ctx, st.GetWorker().GetNode())
	if err != nil {
		return restored{}, err
	}
	nodeOp := &torporv1.Operation{ActorUid: a.GetMetadata().GetUid(), OperationId: op.GetId(), Worker: st.GetWorker().GetName()}
	workload, err := actorWorkload(a)
	if err != nil {
		return restored{}, err
	}
	if op.GetRestoreScope() == torporv1.RestoreScope_RESTORE_SCOPE_BOOT {
		_, err = agent.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: nodeOp, Workload: workload}))
		return restored{egress: workload.GetEgress()}, err
	}
	req := &torporv1.RestoreRequest{Op: nodeOp, Workload: workload, Scope: op.GetRestoreScope()}
	space := a.GetMetadata().GetSpace()
	var snap *torporv1.Snapshot
	if req.Snapshot, snap, err = e.snapshotSource(ctx, space, op.GetSourceSnapshot(), source); err != nil {
		return restored{}, err
	}
	// A fork's first snapshot is another actor's state: the guest is
	// told (node identity files), so it can renew what must be unique.
	workload.ForkedFrom = snap.GetForkedFromActor()
	if req.Golden, _, err = e.snapshotSource(ctx, space, op.GetGoldenSnapshot(), nil); err != nil {
		return restored{}, err
	}
	resp, err := agent.Restore(ctx, connect.NewRequest(req))
	if err != nil {
		return restored{}, err
	}
	return restored{warm: resp.Msg.GetWarm(), steps: resp.Msg.GetSteps(), egress: workload.GetEgress()}, nil
}

// resumedReason is the history's reason of a resume that ended: how it
// restored, whether into a sandbox made ahead (a warm worker), and where
// the time went, so a slow activation can be read off the events:
//
//	resumed (FULL, into a warm sandbox); claim 2.1ms, node 95.3ms (unpack 0.1ms, fetch 0.4ms, ...)
//
// The finalize that records it is the event's duration minus these.
func resumedReason(op *torporv1.ActorOperation, res restored) string {
	var b strings.Builder
	b.WriteString("resumed (" + enum.Name(op.GetRestoreScope()))
	if res.warm {
		b.WriteString(", into a warm sandbox")
	}
	fmt.Fprintf(&b, "); claim %s, node %s", millis(res.claim), millis(res.node))
	if len(res.steps) > 0 {
		b.WriteString(" (" + stepsText(res.steps) + ")")
	}
	return b.String()
}

// stepsText lists a node operation's steps and their durations, in order:
// "capture 120.3ms, upload 410.0ms".
func stepsText(steps []*torporv1.StepDuration) string {
	parts := make([]string, len(steps))
	for i, st := range steps {
		parts[i] = st.GetName() + " " + millis(time.Duration(st.GetDurationUs())*time.Microsecond)
	}
	return strings.Join(parts, ", ")
}

// millis writes d in milliseconds with one decimal.
func millis(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) + "ms"
}

// snapshotSource is where the node finds snapshot name, and its record:
// known when that is it, read from the store otherwise.
func (e *Engine) snapshotSource(ctx context.Context, space, name string, known *torporv1.Snapshot) (*torporv1.SnapshotSource, *torporv1.Snapshot, error) {
	if name == "" {
		return nil, nil, nil
	}
	snap := known
	if m := known.GetMetadata(); m.GetSpace() != space || m.GetName() != name {
		var err error
		if snap, err = e.store.Snapshots().Get(ctx, space, name); err != nil {
			return nil, nil, fmt.Errorf("snapshot %s/%s: %w", space, name, err)
		}
	}
	return &torporv1.SnapshotSource{Location: snap.GetLocation(), ManifestDigest: snap.GetManifestDigest(), Node: snap.GetNode()}, snap, nil
}

// terminateTimeout bounds a terminate call, which nobody waits for.
const terminateTimeout = 30 * time.Second

// warmTemplate is the template whose warm workers serve a resume by
// plan: its own, for a restore; none for a cold boot, which starts its
// workload in a sandbox made for it or in a new one.
func warmTemplate(plan RestorePlan, tmpl *torporv1.Template) string {
	if plan.Scope == torporv1.RestoreScope_RESTORE_SCOPE_BOOT {
		return ""
	}
	return tmpl.GetMetadata().GetUid()
}
