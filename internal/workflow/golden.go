package workflow

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/scheduler"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
)

// goldenActorName marks a worker claimed by a golden build rather than an
// actor; the template's uid stands in for the actor's.
const goldenActorPrefix = "golden:"

// BuildGoldens builds the golden snapshot of every PENDING template
// revision: boot it on a free worker, wait for readiness, checkpoint FULL to
// snapshot storage, record it. With no free worker a build evicts an idle
// actor as a resume does (evictFor); with none to evict the revision waits
// in PENDING.
func (e *Engine) BuildGoldens(ctx context.Context) error {
	templates, err := store.ListAll(ctx, e.store.Revisions(), store.ListOptions{Filter: store.Filter{"phase": torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING.String()}})
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range templates {
		errs = append(errs, e.buildGolden(ctx, t))
	}
	return errors.Join(errs...)
}

func (e *Engine) buildGolden(ctx context.Context, t *torporv1.Template) error {
	key := t.GetMetadata().GetSpace() + "/" + t.GetMetadata().GetName()
	log := e.log.With("template", key)
	live, err := e.placeableNodes(ctx)
	if err != nil {
		return err
	}
	// The build's worker is claimed under the template's uid, so an
	// eviction can reserve a worker for it as for an actor.
	builder := &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: t.GetMetadata().GetSpace(), Name: goldenActorPrefix + t.GetMetadata().GetName(), Uid: t.GetMetadata().GetUid()}}
	req := scheduler.Request{SandboxClass: t.GetSpec().GetSandboxClass(), WarmFor: t.GetMetadata().GetUid()}
	var w *torporv1.Worker
	for evicted := false; ; evicted = true {
		free, err := e.freeWorkers(ctx)
		if err != nil {
			return err
		}
		req.Now = e.now()
		w, err = scheduler.Pick(free, live, req)
		var noWorker *scheduler.NoWorkerError
		if !errors.As(err, &noWorker) {
			if err != nil {
				return err
			}
			break
		}
		// Like a resume, a build that finds no free worker makes room by
		// evicting an idle actor, once.
		if !evicted {
			full := &noFreeWorker{live: live, req: req, cause: err, err: err}
			if err = e.evictFor(ctx, builder, full); err == nil {
				continue
			}
		}
		return e.setTemplateStatus(ctx, t, torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING, "waiting for a worker: "+connectMessage(err))
	}
	// Claim the worker and move to BUILDING together, so two replicas never
	// build one golden twice and no worker is claimed for nothing.
	w.Status.Actor = &torporv1.ActorRef{Space: t.GetMetadata().GetSpace(), Name: goldenActorPrefix + t.GetMetadata().GetName(), Uid: t.GetMetadata().GetUid()}
	w.Status.WarmActorUid, w.Status.WarmTemplateUid, w.Status.ReservedForActorUid, w.Status.ReserveTime = "", "", "", nil
	t.Status.Phase = torporv1.TemplatePhase_TEMPLATE_PHASE_BUILDING
	t.Status.Message = "booting on worker " + w.GetMetadata().GetName()
	var building *torporv1.Template
	err = e.store.InTx(ctx, func(tx store.Tx) error {
		if _, err := tx.Workers().Update(ctx, w); err != nil {
			return err
		}
		var err error
		building, err = tx.Revisions().Update(ctx, t)
		return err
	})
	if errors.Is(err, store.ErrConflict) {
		return nil // someone else claimed the worker or the template; the next pass retries
	}
	if err != nil {
		return err
	}
	t = building
	ref := &torporv1.WorkerRef{Namespace: w.GetMetadata().GetSpace(), Name: w.GetMetadata().GetName(), Uid: w.GetMetadata().GetUid(), Node: w.GetSpec().GetNode()}
	start := e.now()
	snap, warnings, buildErr := e.runGolden(ctx, t, ref)
	e.metrics.observe("golden", start, buildErr)
	if buildErr == nil {
		e.metrics.snapshotBytes.WithLabelValues("golden").Add(float64(snap.GetSizeBytes()))
	}
	err = e.endStep(ctx, log, func() error {
		return e.store.InTx(ctx, func(tx store.Tx) error {
			if err := releaseWorker(ctx, tx, ref, t.GetMetadata().GetUid()); err != nil {
				return err
			}
			cur, err := tx.Revisions().Get(ctx, t.GetMetadata().GetSpace(), t.GetMetadata().GetName())
			if err != nil || cur.GetMetadata().GetUid() != t.GetMetadata().GetUid() {
				return err // deleted meanwhile
			}
			rev := cur.GetStatus().GetRevision()
			switch {
			case buildErr != nil && unreachable(buildErr):
				// A node restarting is no fault of the template's: build
				// it again, on whichever worker is free then.
				cur.Status = &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING, Message: "node did not answer, building again: " + connectMessage(buildErr), Revision: rev}
			case buildErr != nil:
				cur.Status = &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED, Message: connectMessage(buildErr), Revision: rev}
			default:
				if _, err := tx.Snapshots().Create(ctx, snap); err != nil {
					return err
				}
				cur.Status = &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_READY, GoldenSnapshot: snap.GetMetadata().GetName(), Revision: rev, Message: strings.Join(warnings, "; ")}
			}
			_, err = tx.Revisions().Update(ctx, cur)
			return err
		})
	})
	if buildErr != nil {
		log.Warn("golden build failed", "err", buildErr)
	} else if err == nil {
		log.Info("golden snapshot ready", "snapshot", snap.GetMetadata().GetName(), "bytes", snap.GetSizeBytes())
	}
	return err
}

// runGolden boots t on w, checking its port, and checkpoints it: the
// golden snapshot, and what the boot warned of.
func (e *Engine) runGolden(ctx context.Context, t *torporv1.Template, w *torporv1.WorkerRef) (*torporv1.Snapshot, []string, error) {
	agent, err := e.agents.Agent(ctx, w.GetNode())
	if err != nil {
		return nil, nil, err
	}
	m := t.GetMetadata()
	opID := newOperationID()
	op := &torporv1.Operation{ActorUid: m.GetUid(), OperationId: opID, Worker: w.GetName()}
	workload, err := templateWorkload(t, goldenActorPrefix+m.GetName(), m.GetUid())
	if err != nil {
		return nil, nil, err
	}
	cleanup := &torporv1.Operation{ActorUid: m.GetUid(), OperationId: opID + "-terminate", Worker: w.GetName()}
	run, err := agent.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op, Workload: workload, CheckPort: true}))
	if err != nil {
		e.terminateWorkload(ctx, agent, cleanup)
		return nil, nil, fmt.Errorf("boot template %s/%s: %w", m.GetSpace(), m.GetName(), err)
	}
	name := newSnapshotName(e.now())
	location, err := snapshot.Location(m.GetSpace(), m.GetUid(), name)
	if err != nil {
		return nil, nil, err
	}
	resp, err := agent.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{
		Op:       &torporv1.Operation{ActorUid: m.GetUid(), OperationId: opID + "-checkpoint", Worker: w.GetName()},
		Scope:    torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		Target:   torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE,
		Location: location,
	}))
	if err != nil {
		e.terminateWorkload(ctx, agent, cleanup)
		return nil, nil, fmt.Errorf("checkpoint template %s/%s: %w", m.GetSpace(), m.GetName(), err)
	}
	return &torporv1.Snapshot{
		Metadata:       &torporv1.ObjectMeta{Space: m.GetSpace(), Name: name},
		ActorUid:       m.GetUid(),
		Scope:          torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		TemplateUid:    m.GetUid(),
		TemplateName:   m.GetName(),
		TemplateSpec:   t.GetSpec(),
		Location:       resp.Msg.GetLocation(),
		ManifestDigest: resp.Msg.GetManifestDigest(),
		SizeBytes:      resp.Msg.GetSizeBytes(),
		HasData:        resp.Msg.GetHasData(),
	}, run.Msg.GetWarnings(), nil
}

func (e *Engine) setTemplateStatus(ctx context.Context, t *torporv1.Template, phase torporv1.TemplatePhase, msg string) error {
	if t.GetStatus().GetPhase() == phase && t.GetStatus().GetMessage() == msg {
		return nil
	}
	t.Status = &torporv1.TemplateStatus{Phase: phase, Message: msg, Revision: t.GetStatus().GetRevision()}
	_, err := e.store.Revisions().Update(ctx, t)
	if errors.Is(err, store.ErrConflict) {
		return nil
	}
	return err
}

// RequeueGoldens sends revisions left BUILDING by a stopped control plane
// back to PENDING, releasing their workers, so they are built again.
func (e *Engine) RequeueGoldens(ctx context.Context) error {
	templates, err := store.ListAll(ctx, e.store.Revisions(), store.ListOptions{Filter: store.Filter{"phase": torporv1.TemplatePhase_TEMPLATE_PHASE_BUILDING.String()}})
	if err != nil {
		return err
	}
	workers, err := store.ListAll(ctx, e.store.Workers(), store.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range templates {
		for _, w := range workers {
			if w.GetStatus().GetActor().GetUid() != t.GetMetadata().GetUid() {
				continue
			}
			ref := &torporv1.WorkerRef{Namespace: w.GetMetadata().GetSpace(), Name: w.GetMetadata().GetName(), Node: w.GetSpec().GetNode()}
			if agent, err := e.agents.Agent(ctx, ref.GetNode()); err == nil {
				e.terminateWorkload(ctx, agent, &torporv1.Operation{ActorUid: t.GetMetadata().GetUid(), OperationId: newOperationID(), Worker: ref.GetName()})
			}
			errs = append(errs, e.store.InTx(ctx, func(tx store.Tx) error { return releaseWorker(ctx, tx, ref, t.GetMetadata().GetUid()) }))
		}
		errs = append(errs, e.setTemplateStatus(ctx, t, torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING, "requeued after a control plane restart"))
	}
	return errors.Join(errs...)
}
