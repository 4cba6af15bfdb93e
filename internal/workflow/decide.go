package workflow

import (
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// SourceKind is where a resume takes the actor's state from.
type SourceKind int

const (
	// SourceNone: the actor has never been checkpointed.
	SourceNone SourceKind = iota
	// SourceLocal: a pause left a checkpoint on a node.
	SourceLocal
	// SourceDurable: a snapshot in snapshot storage.
	SourceDurable
)

func (k SourceKind) String() string {
	return [...]string{"none", "local checkpoint", "durable snapshot"}[k]
}

// RestoreInput is everything the restore decision depends on (DESIGN
// invariant 6). It is a value so the decision is a pure function of it.
type RestoreInput struct {
	Source SourceKind
	// Scope the source was captured with (ignored for SourceNone).
	SourceScope torporv1.SnapshotScope
	// Template UID the source's guest state was built on.
	SourceTemplateUID string
	// The template the actor points at now.
	ActorTemplateUID string
	// SameGuest: the source's template and the actor's differ only in
	// policies (SameGuest below), so the source's memory is the memory of
	// a guest the actor's template would boot.
	SameGuest bool
	// The actor's template policy for DATA restores.
	FromData torporv1.FromData
	// The current template's golden snapshot; empty when not ready.
	Golden string
	// Cold boot was asked for explicitly (only meaningful without state).
	ForceBoot bool
	// NoGolden: the actor never starts on a golden image. An E2B
	// sandbox's container process is the in-sandbox API's supervisor,
	// which a template's golden image does not run (and runsc restores a
	// sandbox only with the argv it was captured with).
	NoGolden bool
}

// RestorePlan is the decision: how to bring the actor back.
type RestorePlan struct {
	Scope torporv1.RestoreScope
	// The golden snapshot to restore memory from (DATA_ON_GOLDEN only).
	Golden string
	// Whether the actor's own source (memory or data) is used.
	UseSource bool
	// Whether the source held memory that this plan does not bring back.
	DiscardsMemory bool
}

// DecideRestore is the single place that maps a resume's inputs to a
// restore scope. Rules:
//   - no state: the current template's golden when there is one (unless a
//     cold boot is forced or the actor never starts on one), else a cold
//     boot;
//   - same template: the source's own scope; a DATA source rides the
//     golden when the template's policy is GOLDEN and a golden exists;
//   - template replaced: memory never crosses templates, so DATA, or
//     DATA_ON_GOLDEN with the new template's golden when its policy says so;
//     a revision that changes only policies is the same guest, and is
//     treated as the same template.
//
// A local checkpoint's SourceTemplateUID is the template it was captured
// under, never a durable snapshot's.
func DecideRestore(in RestoreInput) RestorePlan {
	if in.NoGolden {
		in.Golden = ""
	}
	onGolden := in.FromData == torporv1.FromData_FROM_DATA_GOLDEN && in.Golden != ""
	if in.Source == SourceNone {
		if in.Golden != "" && !in.ForceBoot {
			return RestorePlan{Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN, Golden: in.Golden}
		}
		return RestorePlan{Scope: torporv1.RestoreScope_RESTORE_SCOPE_BOOT}
	}
	sameTemplate := in.SourceTemplateUID == in.ActorTemplateUID || in.SameGuest
	hasMemory := in.SourceScope == torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL
	if sameTemplate && hasMemory {
		return RestorePlan{Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, UseSource: true}
	}
	plan := RestorePlan{Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA, UseSource: true, DiscardsMemory: hasMemory}
	if onGolden {
		plan.Scope = torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN
		plan.Golden = in.Golden
	}
	return plan
}

// SameGuest reports whether guest state captured under template old can
// be restored as it is under template next: they differ at most in
// policies (idle, eviction, snapshot, warm workers, restart, egress), which decide when
// and how the control plane checkpoints or warms, never what runs.
// Changing an idle timeout must not cost an actor its memory.
func SameGuest(old, next *torporv1.TemplateSpec) bool {
	if old == nil || next == nil {
		return false
	}
	o, n := proto.CloneOf(old), proto.CloneOf(next)
	for _, s := range []*torporv1.TemplateSpec{o, n} {
		s.IdlePolicy, s.SnapshotPolicy, s.WarmWorkers, s.RestartPolicy = nil, nil, 0, torporv1.RestartPolicy_RESTART_POLICY_UNSPECIFIED
		s.Egress = nil
	}
	return proto.Equal(o, n)
}
