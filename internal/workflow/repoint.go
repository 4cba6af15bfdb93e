package workflow

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// SpecUpdate changes an actor's spec.
type SpecUpdate struct {
	// Version, when non-zero, must be the actor's current version.
	Version int64
	// Selector, when non-nil, replaces the worker selector.
	Selector *map[string]string
	// Template, when non-empty, moves the actor to revision Revision of
	// this template (0: its latest), unless it is already there.
	Template string
	Revision int64
	// AllowStateLoss accepts a move that loses state (see CheckMove).
	AllowStateLoss bool
	// Egress, when non-nil, replaces the actor's egress policy (Unset:
	// the template's). The policy, new or kept, must lie within the
	// template revision the actor ends on.
	Egress *egress.Policy
}

// UpdateSpec applies u in one transaction. A move to another template
// revision is allowed only while the actor is SUSPENDED or CRASHED,
// checked in the same transaction as the write, so it cannot interleave
// with a resume: a resume claims the actor by a compare-and-set on its
// version, which this write bumps (invariant 7).
func (e *Engine) UpdateSpec(ctx context.Context, space, name string, u SpecUpdate) (*torporv1.Actor, error) {
	a, _, err := e.updateSpec(ctx, space, name, u)
	return a, err
}

// updateSpec is UpdateSpec, also returning what a move costs (process
// memory, an accepted loss), empty when nothing is lost or nothing moved.
func (e *Engine) updateSpec(ctx context.Context, space, name string, u SpecUpdate) (*torporv1.Actor, string, error) {
	var out *torporv1.Actor
	var cost string
	err := e.store.InTx(ctx, func(tx store.Tx) error {
		out, cost = nil, ""
		a, err := tx.Actors().Get(ctx, space, name)
		if err != nil {
			return err
		}
		if u.Version != 0 && u.Version != a.GetMetadata().GetVersion() {
			return errdefs.Errorf(errdefs.ErrAborted, "actor %s is at version %d, not %d: re-read and retry", actorKey(a), a.GetMetadata().GetVersion(), u.Version)
		}
		if a.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_DELETING {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s is being deleted", actorKey(a))
		}
		if u.Selector != nil {
			a.Spec.WorkerSelector = *u.Selector
		}
		if u.Egress != nil {
			a.Spec.Egress = u.Egress.Proto()
		}
		var moved *transition
		if u.Template != "" {
			if moved, cost, err = e.repoint(ctx, tx, a, u); err != nil {
				return err
			}
		}
		if u.Egress != nil || moved != nil {
			if err := checkActorEgress(ctx, tx, a); err != nil {
				return err
			}
		}
		if out, err = tx.Actors().Update(ctx, a); err != nil {
			return err
		}
		if moved != nil {
			return e.record(ctx, tx, a.GetMetadata().GetUid(), *moved)
		}
		return nil
	})
	if errors.Is(err, store.ErrConflict) {
		return nil, "", errdefs.Errorf(errdefs.ErrAborted, "actor %s/%s changed during the update: retry", space, name)
	}
	return out, cost, err
}

// repoint moves a to the revision u names, unless it is there already
// (then it returns no transition), and says what the move costs. The move is checked against the
// template the actor's latest snapshot was built on, with the same rules
// the resume's claim applies (CheckMove); a loss the request accepts is
// recorded on the actor for that claim.
func (e *Engine) repoint(ctx context.Context, tx store.Tx, a *torporv1.Actor, u SpecUpdate) (*transition, string, error) {
	space := a.GetMetadata().GetSpace()
	_, next, err := Revision(ctx, tx, space, u.Template, u.Revision)
	missing := errors.Is(err, store.ErrNotFound)
	if err != nil && !missing {
		return nil, "", err
	}
	rev := next.GetStatus().GetRevision()
	if !missing && u.Template == a.GetSpec().GetTemplate() && rev == a.GetSpec().GetTemplateRevision() {
		return nil, "", nil
	}
	state := a.GetStatus().GetState()
	if state != torporv1.ActorState_ACTOR_STATE_SUSPENDED && state != torporv1.ActorState_ACTOR_STATE_CRASHED {
		return nil, "", errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s is %s: the template can change only while SUSPENDED or CRASHED", actorKey(a), enum.Name(state))
	}
	if missing {
		return nil, "", errdefs.Errorf(errdefs.ErrFailedPrecondition, "spec.template: %v", err)
	}
	if err := Usable(next); err != nil {
		return nil, "", err
	}
	from := validate.RevisionName(a.GetSpec().GetTemplate(), a.GetSpec().GetTemplateRevision())
	var cost string
	a.Status.AcceptedStateLoss = nil
	if latest := a.GetStatus().GetLatestSnapshot(); latest != "" {
		snap, err := tx.Snapshots().Get(ctx, space, latest)
		if err != nil {
			return nil, "", fmt.Errorf("actor %s: latest snapshot %s: %w", actorKey(a), latest, err)
		}
		loss, err := CheckMove(snap, next)
		switch {
		case err != nil:
			return nil, "", errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s cannot move from %s (the template its snapshot %s was built on) to %s: %v",
				actorKey(a), snap.GetTemplateName(), latest, next.GetMetadata().GetName(), err)
		case loss != "" && !u.AllowStateLoss:
			return nil, "", errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s: moving from %s (the template its snapshot %s was built on) to %s loses state: %s; pass --allow-state-loss to accept that",
				actorKey(a), snap.GetTemplateName(), latest, next.GetMetadata().GetName(), loss)
		case loss != "":
			a.Status.AcceptedStateLoss = &torporv1.AcceptedStateLoss{Snapshot: latest, TemplateUid: next.GetMetadata().GetUid(), Loss: loss}
			cost = "state loss accepted: " + loss
		case snap.GetScope() == torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL && !SameGuest(snap.GetTemplateSpec(), next.GetSpec()):
			cost = "process memory will be discarded, durable data kept"
		}
	}
	a.Spec.Template, a.Spec.TemplateRevision = u.Template, rev
	reason := fmt.Sprintf("template moved from %s to %s", from, next.GetMetadata().GetName())
	if cost != "" {
		reason += "; " + cost
	}
	return &transition{from: state, to: state, reason: reason}, cost, nil
}

// CheckMove says what restoring snapshot snap under template revision next
// loses, when next is not the revision snap was captured under: "" when
// nothing but process memory (a DATA restore keeps every durable volume at
// its place). A volume next lacks or mounts elsewhere, or a FULL snapshot
// without durable data (all of its state is memory), is a loss the user
// must accept. A different sandbox class is an error: snapshots never cross
// classes. Every path that restores a snapshot under another revision
// (a move, a rollout, a resume of an older snapshot, a template deleted
// and created again) runs this, in the resume's claim (invariant 7).
func CheckMove(snap *torporv1.Snapshot, next *torporv1.Template) (loss string, err error) {
	old := snap.GetTemplateSpec()
	if o, n := old.GetSandboxClass(), next.GetSpec().GetSandboxClass(); o != n {
		return "", fmt.Errorf("sandbox class %q differs from %q: snapshots never cross sandbox classes", n, o)
	}
	if SameGuest(old, next.GetSpec()) {
		return "", nil // memory and data come back as they are
	}
	if err := CheckRepoint(old, next.GetSpec()); err != nil {
		return err.Error(), nil
	}
	if !snap.GetHasData() && snap.GetScope() == torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL {
		return "all state discarded (the snapshot holds no durable data, only memory)", nil
	}
	return "", nil
}

// CheckRepoint says whether guest data built on template old can be
// restored under template next: the same sandbox class, the same volumes
// by name and kind in any order, and the same mounts for every container
// present in both. The error names what differs.
func CheckRepoint(old, next *torporv1.TemplateSpec) error {
	if old.GetSandboxClass() != next.GetSandboxClass() {
		return fmt.Errorf("sandbox class %q differs from %q", next.GetSandboxClass(), old.GetSandboxClass())
	}
	oldVolumes, nextVolumes := volumeKinds(old), volumeKinds(next)
	for _, name := range slices.Sorted(maps.Keys(oldVolumes)) {
		kind, ok := nextVolumes[name]
		switch {
		case !ok:
			return fmt.Errorf("volume %q is missing", name)
		case kind != oldVolumes[name]:
			return fmt.Errorf("volume %q changes kind from %v to %v", name, oldVolumes[name], kind)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(nextVolumes)) {
		if _, ok := oldVolumes[name]; !ok {
			return fmt.Errorf("volume %q is new", name)
		}
	}
	nextContainers := map[string]*torporv1.Container{}
	for _, c := range next.GetContainers() {
		nextContainers[c.GetName()] = c
	}
	for _, c := range old.GetContainers() {
		n, ok := nextContainers[c.GetName()]
		if !ok {
			continue
		}
		if om, nm := mountSet(c), mountSet(n); !slices.Equal(om, nm) {
			return fmt.Errorf("container %q mounts [%s], the snapshot's template mounts [%s]", c.GetName(), strings.Join(nm, ", "), strings.Join(om, ", "))
		}
	}
	return nil
}

func volumeKinds(t *torporv1.TemplateSpec) map[string]torporv1.VolumeKind {
	m := map[string]torporv1.VolumeKind{}
	for _, v := range t.GetVolumes() {
		m[v.GetName()] = v.GetKind()
	}
	return m
}

func mountSet(c *torporv1.Container) []string {
	var s []string
	for _, m := range c.GetMounts() {
		mode := "rw"
		if m.GetReadOnly() {
			mode = "ro"
		}
		s = append(s, fmt.Sprintf("%s:%s:%s", m.GetVolume(), m.GetPath(), mode))
	}
	slices.Sort(s)
	return s
}
