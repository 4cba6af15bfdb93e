package workflow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// A template is a name over immutable revisions. The template record (the
// store's Templates) only points at the latest revision; each revision
// (Revisions, named "NAME@REV") has its own uid, spec, status and golden
// snapshot. An actor names the revision it runs (spec.template and
// spec.template_revision) and stays on it until it is moved, so applying a
// template never changes what an existing actor resumes under.

// ApplyResult says what applying a template did.
type ApplyResult int

const (
	// ApplyCreated: a new template, at revision 1.
	ApplyCreated ApplyResult = iota
	// ApplyRevised: the spec differed from the latest revision's; a new
	// revision was added.
	ApplyRevised
	// ApplyUnchanged: the spec is the latest revision's; nothing was written.
	ApplyUnchanged
)

// ApplyTemplate stores spec (validated, with defaults applied) under meta's
// name in tx and returns the view of the revision that holds it.
func ApplyTemplate(ctx context.Context, tx store.Tx, meta *torporv1.ObjectMeta, spec *torporv1.TemplateSpec) (*torporv1.Template, ApplyResult, error) {
	space, name := meta.GetSpace(), meta.GetName()
	result := ApplyCreated
	head, err := tx.Templates().Get(ctx, space, name)
	switch {
	case errors.Is(err, store.ErrNotFound):
		head, err = tx.Templates().Create(ctx, &torporv1.Template{
			Metadata: &torporv1.ObjectMeta{Space: space, Name: name, Labels: meta.GetLabels()},
			Status:   &torporv1.TemplateStatus{LatestRevision: 1},
		})
		if err != nil {
			return nil, 0, err
		}
	case err != nil:
		return nil, 0, err
	default:
		latest, err := tx.Revisions().Get(ctx, space, validate.RevisionName(name, head.GetStatus().GetLatestRevision()))
		if err != nil {
			return nil, 0, fmt.Errorf("template %s/%s: latest revision: %w", space, name, err)
		}
		if proto.Equal(latest.GetSpec(), spec) {
			return TemplateView(head, latest), ApplyUnchanged, nil
		}
		head.Status = &torporv1.TemplateStatus{LatestRevision: head.GetStatus().GetLatestRevision() + 1}
		if head, err = tx.Templates().Update(ctx, head); err != nil {
			return nil, 0, err
		}
		result = ApplyRevised
	}
	rev := head.GetStatus().GetLatestRevision()
	stored, err := tx.Revisions().Create(ctx, &torporv1.Template{
		Metadata: &torporv1.ObjectMeta{Space: space, Name: validate.RevisionName(name, rev), Labels: meta.GetLabels()},
		Spec:     spec,
		Status:   &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING, Revision: rev},
	})
	if err != nil {
		return nil, 0, err
	}
	return TemplateView(head, stored), result, nil
}

// TemplateView is how the API shows revision rev of template head: under
// the template's name, with the revision's uid, spec and status, and the
// template's latest revision number.
func TemplateView(head, rev *torporv1.Template) *torporv1.Template {
	v := proto.Clone(rev).(*torporv1.Template)
	v.Metadata.Name = head.GetMetadata().GetName()
	if v.Status == nil {
		v.Status = &torporv1.TemplateStatus{}
	}
	v.Status.LatestRevision = head.GetStatus().GetLatestRevision()
	return v
}

// Revision reads revision rev of template name (0: the latest) with the
// template's record. Either missing is ErrNotFound, naming it.
func Revision(ctx context.Context, tx store.Tx, space, name string, rev int64) (head, revision *torporv1.Template, err error) {
	if head, err = tx.Templates().Get(ctx, space, name); err != nil {
		return nil, nil, err
	}
	if rev == 0 {
		rev = head.GetStatus().GetLatestRevision()
	}
	if revision, err = tx.Revisions().Get(ctx, space, validate.RevisionName(name, rev)); err != nil {
		return nil, nil, err
	}
	return head, revision, nil
}

// Usable refuses a revision whose golden build FAILED as the one an actor
// is created on or moved to: it would crash on its first resume.
func Usable(rev *torporv1.Template) error {
	if rev.GetStatus().GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "template %s/%s failed its golden build: %s (fix the template and apply it again, or retry with torpor template rebuild)",
			rev.GetMetadata().GetSpace(), rev.GetMetadata().GetName(), rev.GetStatus().GetMessage())
	}
	return nil
}

// RevisionUse is what still uses one revision.
type RevisionUse struct {
	Revision *torporv1.Template
	// Actors whose spec names the revision.
	Actors []string
	// Actors with a kept snapshot captured under the revision (its golden
	// snapshot aside).
	SnapshotActors []string
	Snapshots      int
}

func (u RevisionUse) inUse() bool { return len(u.Actors) > 0 || u.Snapshots > 0 }

func (u RevisionUse) String() string {
	var parts []string
	if n := len(u.Actors); n > 0 {
		parts = append(parts, fmt.Sprintf("%d actor(s) (%s)", n, someNames(u.Actors)))
	}
	if u.Snapshots > 0 {
		parts = append(parts, fmt.Sprintf("%d snapshot(s) of actor(s) %s", u.Snapshots, someNames(u.SnapshotActors)))
	}
	return u.Revision.GetMetadata().GetName() + " is used by " + strings.Join(parts, " and ")
}

// someNames lists the first few names of many.
func someNames(names []string) string {
	const shown = 5
	if len(names) <= shown {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:shown], ", ") + fmt.Sprintf(", and %d more", len(names)-shown)
}

// Use reads what uses revision rev: actors on it, and snapshots captured
// under it other than its own golden snapshot.
func Use(ctx context.Context, tx store.Tx, rev *torporv1.Template) (RevisionUse, error) {
	m := rev.GetMetadata()
	u := RevisionUse{Revision: rev}
	actors, err := store.ListAll(ctx, tx.Actors(), store.ListOptions{Space: m.GetSpace(), Filter: store.Filter{"template": m.GetName()}})
	if err != nil {
		return u, err
	}
	for _, a := range actors {
		u.Actors = append(u.Actors, a.GetMetadata().GetName())
	}
	snaps, err := store.ListAll(ctx, tx.Snapshots(), store.ListOptions{Space: m.GetSpace(), Filter: store.Filter{"template_uid": m.GetUid()}})
	if err != nil {
		return u, err
	}
	for _, s := range snaps {
		if s.GetActorUid() == m.GetUid() {
			continue // its golden snapshot
		}
		u.Snapshots++
		if !slices.Contains(u.SnapshotActors, s.GetActorName()) {
			u.SnapshotActors = append(u.SnapshotActors, s.GetActorName())
		}
	}
	return u, nil
}

// DeleteTemplate deletes template name with all its revisions (rev 0) or
// one revision other than the latest, with their golden snapshots. Nothing
// is deleted while an actor or a snapshot uses one of them
// (FailedPrecondition naming them). uid and version, when set, must be
// those of the revision named (rev 0: the latest).
func (e *Engine) DeleteTemplate(ctx context.Context, space, name string, rev int64, uid string, version int64) error {
	var goldens []*torporv1.Snapshot
	err := e.store.InTx(ctx, func(tx store.Tx) error {
		goldens = nil
		head, named, err := Revision(ctx, tx, space, name, rev)
		if err != nil {
			return err
		}
		nm := named.GetMetadata()
		if (uid != "" && uid != nm.GetUid()) || (version != 0 && version != nm.GetVersion()) {
			return errdefs.Errorf(errdefs.ErrAborted, "template %s/%s does not match the given uid or version", space, nm.GetName())
		}
		doomed := []*torporv1.Template{named}
		if rev == 0 {
			if doomed, err = store.ListAll(ctx, tx.Revisions(), store.ListOptions{Space: space, Filter: store.Filter{"template": name}}); err != nil {
				return err
			}
		} else if rev == head.GetStatus().GetLatestRevision() {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s is the latest revision of template %s/%s: delete the template, or apply a new revision first", nm.GetName(), space, name)
		}
		var used []string
		for _, r := range doomed {
			if r.GetStatus().GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_BUILDING {
				return errdefs.Errorf(errdefs.ErrFailedPrecondition, "template %s/%s: the golden build of %s is running; delete it once the build ends", space, name, r.GetMetadata().GetName())
			}
			u, err := Use(ctx, tx, r)
			if err != nil {
				return err
			}
			if u.inUse() {
				used = append(used, u.String())
			}
		}
		if len(used) > 0 {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "template %s/%s is still in use: %s; move those actors (actor update --template, template rollout) or delete them first",
				space, name, strings.Join(used, "; "))
		}
		for _, r := range doomed {
			// The revision goes first: then nothing holds its golden
			// snapshot.
			rm := r.GetMetadata()
			if err := tx.Revisions().Delete(ctx, space, rm.GetName(), rm.GetUid(), rm.GetVersion()); err != nil {
				return err
			}
			if g := r.GetStatus().GetGoldenSnapshot(); g != "" {
				snap, err := deleteLetGoInTx(ctx, tx, nil, space, g)
				if err != nil {
					return err
				}
				if snap != nil {
					goldens = append(goldens, snap)
				}
			}
		}
		if rev == 0 {
			return tx.Templates().Delete(ctx, space, name, head.GetMetadata().GetUid(), head.GetMetadata().GetVersion())
		}
		return nil
	})
	if errors.Is(err, store.ErrConflict) {
		return errdefs.Errorf(errdefs.ErrAborted, "template %s/%s changed while deleting: retry", space, name)
	}
	if err != nil {
		return err
	}
	for _, g := range goldens {
		// The records are gone, so nothing refers to these files any more;
		// one left behind costs storage, not correctness.
		if err := e.removeSnapshotFiles(ctx, g); err != nil {
			e.log.Warn("remove golden snapshot files of a deleted template", "template", space+"/"+name, "snapshot", g.GetMetadata().GetName(), "location", g.GetLocation(), "err", err)
		}
	}
	e.log.Info("template deleted", "template", space+"/"+name, "revision", rev, "golden_snapshots", len(goldens))
	return nil
}

// RebuildTemplate sends a FAILED revision (rev 0: the latest) back to
// PENDING so its golden snapshot is built again.
func (e *Engine) RebuildTemplate(ctx context.Context, space, name string, rev int64) (*torporv1.Template, error) {
	var out *torporv1.Template
	err := e.store.InTx(ctx, func(tx store.Tx) error {
		head, r, err := Revision(ctx, tx, space, name, rev)
		if err != nil {
			return err
		}
		if phase := r.GetStatus().GetPhase(); phase != torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "template %s/%s is %s: only a FAILED golden build is rebuilt", space, r.GetMetadata().GetName(), phaseName(phase))
		}
		r.Status = &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING, Message: "rebuild requested after: " + r.GetStatus().GetMessage(), Revision: r.GetStatus().GetRevision()}
		if r, err = tx.Revisions().Update(ctx, r); err != nil {
			return err
		}
		out = TemplateView(head, r)
		return nil
	})
	if errors.Is(err, store.ErrConflict) {
		return nil, errdefs.Errorf(errdefs.ErrAborted, "template %s/%s changed during the rebuild request: retry", space, name)
	}
	return out, err
}

func phaseName(p torporv1.TemplatePhase) string {
	return strings.TrimPrefix(p.String(), "TEMPLATE_PHASE_")
}

// RolloutResult is what a rollout did to one actor.
type RolloutResult struct {
	Actor        string
	FromRevision int64
	Moved        bool
	// Why the actor did not move, or what its move costs.
	Message string
}

// Rollout moves every actor on an older revision of template name to its
// latest revision, each in its own transaction under the repoint rules
// (UpdateSpec): an actor that is not SUSPENDED or CRASHED, or whose move
// would lose state without allowStateLoss, stays and is reported.
func (e *Engine) Rollout(ctx context.Context, space, name string, allowStateLoss bool) (*torporv1.Template, []RolloutResult, error) {
	head, latest, err := Revision(ctx, e.store, space, name, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := Usable(latest); err != nil {
		return nil, nil, err
	}
	target := latest.GetStatus().GetRevision()
	var results []RolloutResult
	for rev := int64(1); rev < target; rev++ {
		actors, err := store.ListAll(ctx, e.store.Actors(), store.ListOptions{Space: space, Filter: store.Filter{"template": validate.RevisionName(name, rev)}})
		if err != nil {
			return nil, nil, err
		}
		for _, a := range actors {
			r := RolloutResult{Actor: a.GetMetadata().GetName(), FromRevision: rev}
			_, cost, err := e.updateSpec(ctx, space, r.Actor, SpecUpdate{Template: name, Revision: target, AllowStateLoss: allowStateLoss})
			if err != nil {
				r.Message = connectMessage(err)
			} else {
				r.Moved, r.Message = true, cost
			}
			e.log.Info("rollout", "template", space+"/"+name, "actor", space+"/"+r.Actor, "from", rev, "to", target, "moved", r.Moved, "message", r.Message)
			results = append(results, r)
		}
	}
	return TemplateView(head, latest), results, nil
}
