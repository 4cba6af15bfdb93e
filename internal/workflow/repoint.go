package workflow

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// SpecUpdate changes an actor's spec.
type SpecUpdate struct {
	// Version, when non-zero, must be the actor's current version.
	Version int64
	// Selector, when non-nil, replaces the worker selector.
	Selector *map[string]string
	// Template, when non-empty and different, repoints the actor.
	Template string
	// AllowStateLoss accepts a repoint that discards all of the actor's
	// state (its snapshot holds no durable data).
	AllowStateLoss bool
}

// UpdateSpec applies u in one transaction. A repoint is allowed only while
// the actor is SUSPENDED or CRASHED, checked in the same transaction as
// the write, so it cannot interleave with a resume: a resume claims the
// actor by a compare-and-set on its version, which this write bumps
// (invariant 7).
func (e *Engine) UpdateSpec(ctx context.Context, space, name string, u SpecUpdate) (*torporv1.Actor, error) {
	var out *torporv1.Actor
	err := e.store.InTx(ctx, func(tx store.Tx) error {
		a, err := tx.Actors().Get(ctx, space, name)
		if err != nil {
			return err
		}
		if u.Version != 0 && u.Version != a.GetMetadata().GetVersion() {
			return codeError(connect.CodeAborted, "actor %s is at version %d, not %d: re-read and retry", actorKey(a), a.GetMetadata().GetVersion(), u.Version)
		}
		if a.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_DELETING {
			return codeError(connect.CodeFailedPrecondition, "actor %s is being deleted", actorKey(a))
		}
		if u.Selector != nil {
			a.Spec.WorkerSelector = *u.Selector
		}
		var repointed *transition
		if u.Template != "" && u.Template != a.GetSpec().GetTemplate() {
			if repointed, err = e.repoint(ctx, tx, a, u); err != nil {
				return err
			}
		}
		if out, err = tx.Actors().Update(ctx, a); err != nil {
			return err
		}
		if repointed != nil {
			return e.record(ctx, tx, a.GetMetadata().GetUid(), *repointed)
		}
		return nil
	})
	if errors.Is(err, store.ErrConflict) {
		return nil, codeError(connect.CodeAborted, "actor %s/%s changed during the update: retry", space, name)
	}
	return out, err
}

func (e *Engine) repoint(ctx context.Context, tx store.Tx, a *torporv1.Actor, u SpecUpdate) (*transition, error) {
	state := a.GetStatus().GetState()
	if state != torporv1.ActorState_ACTOR_STATE_SUSPENDED && state != torporv1.ActorState_ACTOR_STATE_CRASHED {
		return nil, codeError(connect.CodeFailedPrecondition, "actor %s is %s: the template can change only while SUSPENDED or CRASHED", actorKey(a), stateName(state))
	}
	space := a.GetMetadata().GetSpace()
	next, err := tx.Templates().Get(ctx, space, u.Template)
	if errors.Is(err, store.ErrNotFound) {
		return nil, codeError(connect.CodeFailedPrecondition, "spec.template: template %s/%s does not exist", space, u.Template)
	}
	if err != nil {
		return nil, err
	}
	reason := fmt.Sprintf("template repointed from %s to %s", a.GetSpec().GetTemplate(), u.Template)
	if latest := a.GetStatus().GetLatestSnapshot(); latest != "" {
		snap, err := tx.Snapshots().Get(ctx, space, latest)
		if err != nil {
			return nil, fmt.Errorf("actor %s: latest snapshot %s: %w", actorKey(a), latest, err)
		}
		// Compare with the template the snapshot's guest state was built
		// on, kept with the snapshot: a deleted old template or a chain of
		// repoints cannot skip the check.
		if err := CheckRepoint(snap.GetTemplateSpec(), next.GetSpec()); err != nil {
			return nil, codeError(connect.CodeFailedPrecondition, "actor %s cannot move from template %s (the one its snapshot %s was built on) to %s: %v",
				actorKey(a), snap.GetTemplateName(), latest, u.Template, err)
		}
		if !snap.GetHasData() {
			if !u.AllowStateLoss {
				return nil, codeError(connect.CodeFailedPrecondition, "actor %s: snapshot %s holds no durable data, so a repoint discards all of its state; pass --allow-state-loss to accept that", actorKey(a), latest)
			}
			reason += "; all state discarded (the snapshot holds no durable data)"
		} else if snap.GetScope() == torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL {
			reason += "; process memory will be discarded, durable data kept"
		}
	}
	a.Spec.Template = u.Template
	return &transition{from: state, to: state, reason: reason}, nil
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
