package workflow

import (
	"fmt"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// TestDecideRestoreAllInputs walks every combination of the decision's
// inputs and checks each against the rules stated independently here.
func TestDecideRestoreAllInputs(t *testing.T) {
	const (
		full = torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL
		data = torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA
	)
	sources := []SourceKind{SourceNone, SourceLocal, SourceDurable}
	scopes := []torporv1.SnapshotScope{full, data}
	policies := []torporv1.FromData{torporv1.FromData_FROM_DATA_COLD_BOOT, torporv1.FromData_FROM_DATA_GOLDEN}
	goldens := []string{"", "golden-new"}
	count := 0
	for _, src := range sources {
		for _, scope := range scopes {
			for _, sameTemplate := range []bool{true, false} {
				for _, sameGuest := range []bool{true, false} {
					for _, policy := range policies {
						for _, golden := range goldens {
							for _, force := range []bool{false, true} {
								in := RestoreInput{
									Source: src, SourceScope: scope,
									SourceTemplateUID: "tmpl-a", ActorTemplateUID: "tmpl-a",
									FromData: policy, Golden: golden, ForceBoot: force, SameGuest: sameGuest,
								}
								if !sameTemplate {
									in.ActorTemplateUID = "tmpl-b"
								}
								name := fmt.Sprintf("%v/%v/same=%v/guest=%v/%v/golden=%q/boot=%v", src, scope, sameTemplate, sameGuest, policy, golden, force)
								t.Run(name, func(t *testing.T) {
									checkPlan(t, in, DecideRestore(in))
								})
								count++
							}
						}
					}
				}
			}
		}
	}
	if count != 3*2*2*2*2*2*2 {
		t.Fatalf("covered %d combinations", count)
	}
}

func checkPlan(t *testing.T, in RestoreInput, got RestorePlan) {
	t.Helper()
	scope := got.Scope
	switch {
	case in.Source == SourceNone && in.Golden != "" && !in.ForceBoot:
		want(t, scope == torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN && got.Golden == in.Golden && !got.UseSource, "a fresh actor starts from its template's golden", got)
	case in.Source == SourceNone:
		want(t, scope == torporv1.RestoreScope_RESTORE_SCOPE_BOOT && got.Golden == "" && !got.UseSource, "a fresh actor without golden cold-boots", got)
	case (in.SourceTemplateUID == in.ActorTemplateUID || in.SameGuest) && in.SourceScope == torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL:
		want(t, scope == torporv1.RestoreScope_RESTORE_SCOPE_FULL && got.UseSource && !got.DiscardsMemory && got.Golden == "", "same template (or a revision of only its policies) keeps a FULL source FULL", got)
	default:
		// Memory cannot be used: DATA, on the current template's golden
		// when its policy asks for it and it exists.
		wantGolden := in.FromData == torporv1.FromData_FROM_DATA_GOLDEN && in.Golden != ""
		if wantGolden {
			want(t, scope == torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN && got.Golden == in.Golden, "DATA rides the current template's golden", got)
		} else {
			want(t, scope == torporv1.RestoreScope_RESTORE_SCOPE_DATA && got.Golden == "", "DATA cold-boots without a golden policy", got)
		}
		want(t, got.UseSource, "the source's data is restored", got)
		want(t, got.DiscardsMemory == (in.SourceScope == torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL), "discarded memory is reported", got)
	}
}

func want(t *testing.T, ok bool, rule string, got RestorePlan) {
	t.Helper()
	if !ok {
		t.Fatalf("%s: got %+v", rule, got)
	}
}

// TestSameGuest: only policies may differ for a snapshot's memory to be
// restored under another revision.
func TestSameGuest(t *testing.T) {
	base := func() *torporv1.TemplateSpec { return withEnv(withData(), "1") }
	tests := []struct {
		name   string
		change func(*torporv1.TemplateSpec)
		want   bool
	}{
		{"identical", func(*torporv1.TemplateSpec) {}, true},
		{"idle policy", func(s *torporv1.TemplateSpec) {
			s.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 30, Action: torporv1.IdleAction_IDLE_ACTION_PAUSE}
		}, true},
		{"snapshot policy", func(s *torporv1.TemplateSpec) { s.SnapshotPolicy = &torporv1.SnapshotPolicy{Keep: 5} }, true},
		{"warm workers", func(s *torporv1.TemplateSpec) { s.WarmWorkers = 2 }, true},
		{"env", func(s *torporv1.TemplateSpec) { s.Containers[0].Env[0].Value = "2" }, false},
		{"image", func(s *torporv1.TemplateSpec) { s.Containers[0].Image = "other" }, false},
		{"volume", func(s *torporv1.TemplateSpec) { s.Volumes = nil }, false},
		{"resources", func(s *torporv1.TemplateSpec) { s.Resources = &torporv1.Resources{MemoryMb: 512} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := base()
			tt.change(next)
			if got := SameGuest(base(), next); got != tt.want {
				t.Fatalf("SameGuest after changing %s = %v, want %v", tt.name, got, tt.want)
			}
		})
	}
	if SameGuest(nil, base()) {
		t.Fatal("a snapshot without a recorded spec is taken for the same guest")
	}
}

// TestDecideRestoreNoGolden: an actor that never starts on a golden image
// (an E2B sandbox) cold-boots without state and restores DATA without
// the golden, whatever the template's policy; its own memory restores as
// ever.
func TestDecideRestoreNoGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   RestoreInput
		want torporv1.RestoreScope
	}{
		{"no state", RestoreInput{Source: SourceNone, Golden: "g"}, torporv1.RestoreScope_RESTORE_SCOPE_BOOT},
		{"data on golden policy", RestoreInput{Source: SourceDurable, SourceScope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA, SourceTemplateUID: "t", ActorTemplateUID: "t", FromData: torporv1.FromData_FROM_DATA_GOLDEN, Golden: "g"}, torporv1.RestoreScope_RESTORE_SCOPE_DATA},
		{"own memory", RestoreInput{Source: SourceDurable, SourceScope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, SourceTemplateUID: "t", ActorTemplateUID: "t", Golden: "g"}, torporv1.RestoreScope_RESTORE_SCOPE_FULL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.NoGolden = true
			if got := DecideRestore(tc.in); got.Scope != tc.want || got.Golden != "" {
				t.Fatalf("plan %+v, want scope %v without a golden", got, tc.want)
			}
		})
	}
}
