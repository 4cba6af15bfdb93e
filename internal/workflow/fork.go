package workflow

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// ForkOptions say what a new actor is forked from and onto which
// template revision.
type ForkOptions struct {
	// Actor, in the new actor's space: its latest snapshot. A RUNNING one
	// is suspended for the fork and resumed after it.
	Actor string
	// Tag: "TAG" in the new actor's space or "SPACE/TAG", published.
	Tag string
	// Template and Revision (0: the latest) of the new actor; an empty
	// Template means the snapshot's own revision (same space only).
	Template string
	Revision int64
	Selector map[string]string
	Labels   map[string]string
	// AllowStateLoss accepts a template that loses some of the snapshot's
	// state (CheckMove).
	AllowStateLoss bool
}

// Fork creates actor space/name SUSPENDED at a snapshot of another
// actor: its first resume restores that snapshot's memory and files
// (as the restore decision allows under its template) with its own
// identity. The new actor's first snapshot record names the source's
// files instead of copying them (Snapshot.forked_from).
func (e *Engine) Fork(ctx context.Context, space, name string, opts ForkOptions) (a *torporv1.Actor, err error) {
	start := e.now()
	defer func() { e.metrics.observe("fork", start, err) }()
	if (opts.Actor == "") == (opts.Tag == "") {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "fork of %s/%s: name exactly one of a source actor and a tag", space, name)
	}
	srcSpace, snapshot, from := space, "", ""
	resumeSource := false
	if opts.Tag != "" {
		tagSpace, tag, ok := strings.Cut(opts.Tag, "/")
		if !ok {
			tagSpace, tag = space, opts.Tag
		}
		t, err := e.store.Tags().Get(ctx, tagSpace, tag)
		if errors.Is(err, store.ErrNotFound) {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "tag %s/%s does not exist", tagSpace, tag)
		}
		if err != nil {
			return nil, err
		}
		if tagSpace != space && t.GetScope() != torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_PUBLISHED {
			return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "tag %s/%s is not published: a fork into space %s needs a published tag (torpor snapshot tag --publish)", tagSpace, tag, space)
		}
		srcSpace, snapshot, from = tagSpace, t.GetSnapshot(), fmt.Sprintf("tag %s/%s", tagSpace, tag)
	} else {
		src, running, err := e.forkableActor(ctx, space, opts.Actor)
		if err != nil {
			return nil, err
		}
		snapshot, from, resumeSource = src.GetStatus().GetLatestSnapshot(), "actor "+actorKey(src), running
	}
	a, err = e.createFork(ctx, space, name, srcSpace, snapshot, from, opts)
	if resumeSource {
		// The source was running: it goes on from the snapshot it was
		// forked at, whether or not the fork was made.
		if _, rerr := e.Resume(ctx, space, opts.Actor, ResumeOptions{}); rerr != nil {
			e.log.Warn("fork: resuming the source actor failed; its next request resumes it", "actor", space+"/"+opts.Actor, "err", rerr)
		}
	}
	return a, err
}

// forkableActor reads the source actor of a fork and makes sure its
// newest state is its latest durable snapshot: a RUNNING actor is
// suspended (running reports that it was).
func (e *Engine) forkableActor(ctx context.Context, space, name string) (src *torporv1.Actor, running bool, err error) {
	src, err = e.store.Actors().Get(ctx, space, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, errdefs.Errorf(errdefs.ErrNotFound, "source actor %s/%s does not exist", space, name)
	}
	if err != nil {
		return nil, false, err
	}
	st := src.GetStatus()
	switch state := st.GetState(); {
	case state == torporv1.ActorState_ACTOR_STATE_RUNNING:
		if src, err = e.Suspend(ctx, space, name); err != nil {
			return nil, false, fmt.Errorf("fork: suspend source actor %s/%s: %w", space, name, err)
		}
		running = true
	case state == torporv1.ActorState_ACTOR_STATE_PAUSED || st.GetLocalCheckpoint() != "":
		return nil, false, errdefs.Errorf(errdefs.ErrFailedPrecondition, "source actor %s is %s with a local checkpoint on its node: resume or suspend it, so that its newest state is in snapshot storage", actorKey(src), enum.Name(state))
	case state != torporv1.ActorState_ACTOR_STATE_SUSPENDED && state != torporv1.ActorState_ACTOR_STATE_CRASHED:
		return nil, false, errdefs.Errorf(errdefs.ErrFailedPrecondition, "source actor %s is %s: retry once it is RUNNING or SUSPENDED", actorKey(src), enum.Name(state))
	}
	if src.GetStatus().GetLatestSnapshot() == "" {
		return nil, false, errdefs.Errorf(errdefs.ErrFailedPrecondition, "source actor %s has no snapshot to fork", actorKey(src))
	}
	return src, running, nil
}

// createFork commits the new actor with its first snapshot record, a
// copy of the source's pointing at the same files, in one transaction
// that also bumps the source record's version, so that no retention or
// delete that read the record before removes it (and its files) under
// the fork (tags.go).
func (e *Engine) createFork(ctx context.Context, space, name, srcSpace, snapshot, from string, opts ForkOptions) (*torporv1.Actor, error) {
	var created *torporv1.Actor
	err := e.store.InTx(ctx, func(tx store.Tx) error {
		created = nil
		if _, err := tx.Spaces().Get(ctx, "", space); errors.Is(err, store.ErrNotFound) {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "space %q does not exist", space)
		} else if err != nil {
			return err
		}
		src, err := taggable(ctx, tx, srcSpace, snapshot)
		if errors.Is(err, store.ErrNotFound) {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "fork from %s: its snapshot %s/%s is gone", from, srcSpace, snapshot)
		}
		if err != nil {
			return err
		}
		tmpl, rev, err := e.forkRevision(ctx, tx, space, srcSpace, src, opts)
		if err != nil {
			return err
		}
		refName := newSnapshotName(e.now())
		st := &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED, StateTime: timestamppb.New(e.now()), LatestSnapshot: refName}
		note := ""
		if src.GetTemplateUid() != rev.GetMetadata().GetUid() {
			loss, err := CheckMove(src, rev)
			if err != nil {
				return errdefs.Errorf(errdefs.ErrFailedPrecondition, "fork from %s: snapshot %s/%s (captured under %s) cannot be restored under %s: %v",
					from, srcSpace, snapshot, src.GetTemplateName(), rev.GetMetadata().GetName(), err)
			}
			if loss != "" && !opts.AllowStateLoss {
				return errdefs.Errorf(errdefs.ErrFailedPrecondition, "fork from %s: restoring snapshot %s/%s (captured under %s) under %s loses state: %s; fork with --allow-state-loss to accept that",
					from, srcSpace, snapshot, src.GetTemplateName(), rev.GetMetadata().GetName(), loss)
			}
			if loss != "" {
				st.AcceptedStateLoss = &torporv1.AcceptedStateLoss{Snapshot: refName, TemplateUid: rev.GetMetadata().GetUid(), Loss: loss}
				note = "; state loss accepted: " + loss
			}
		}
		if _, err := tx.Snapshots().Update(ctx, src); err != nil {
			return err
		}
		if created, err = tx.Actors().Create(ctx, &torporv1.Actor{
			Metadata: &torporv1.ObjectMeta{Space: space, Name: name, Labels: opts.Labels},
			Spec:     &torporv1.ActorSpec{Template: tmpl, TemplateRevision: rev.GetStatus().GetRevision(), WorkerSelector: opts.Selector},
			Status:   st,
		}); err != nil {
			return err
		}
		ref := proto.CloneOf(src)
		ref.Metadata = &torporv1.ObjectMeta{Space: space, Name: refName}
		ref.ActorUid, ref.ActorName = created.GetMetadata().GetUid(), name
		ref.ForkedFrom = srcSpace + "/" + snapshot
		ref.ForkedFromActor = srcSpace + "/" + src.GetActorName()
		if _, err := tx.Snapshots().Create(ctx, ref); err != nil {
			return err
		}
		reason := fmt.Sprintf("forked from %s: snapshot %s/%s, shared as %s%s", from, srcSpace, snapshot, refName, note)
		if err := e.record(ctx, tx, created.GetMetadata().GetUid(), transition{to: torporv1.ActorState_ACTOR_STATE_SUSPENDED, reason: reason}); err != nil {
			return err
		}
		if srcActor, err := tx.Actors().Get(ctx, srcSpace, src.GetActorName()); err == nil && srcActor.GetMetadata().GetUid() == src.GetActorUid() {
			state := srcActor.GetStatus().GetState()
			return e.record(ctx, tx, src.GetActorUid(), transition{from: state, to: state, reason: fmt.Sprintf("snapshot %s forked as %s/%s", snapshot, space, name)})
		}
		return nil
	})
	if errors.Is(err, store.ErrConflict) {
		return nil, errdefs.Errorf(errdefs.ErrAborted, "fork %s/%s: snapshot %s/%s changed meanwhile: retry", space, name, srcSpace, snapshot)
	}
	if err != nil {
		return nil, err
	}
	e.log.Info("actor forked", "actor", space+"/"+name, "actor_uid", created.GetMetadata().GetUid(), "from", from, "snapshot", srcSpace+"/"+snapshot)
	return created, nil
}

// forkRevision is the template revision a fork runs on: the one asked
// for, or the snapshot's own when the fork stays in its space.
func (e *Engine) forkRevision(ctx context.Context, tx store.Tx, space, srcSpace string, src *torporv1.Snapshot, opts ForkOptions) (string, *torporv1.Template, error) {
	name, rev := opts.Template, opts.Revision
	if name == "" {
		if srcSpace != space {
			return "", nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "spec.template: required for a fork from space %s into %s (a template of %s)", srcSpace, space, space)
		}
		var err error
		if name, rev, err = validate.TemplateRef("snapshot template", src.GetTemplateName()); err != nil {
			return "", nil, err
		}
	}
	_, r, err := Revision(ctx, tx, space, name, rev)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "spec.template: %v", err)
	}
	return name, r, err
}
