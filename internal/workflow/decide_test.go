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
				for _, policy := range policies {
					for _, golden := range goldens {
						for _, force := range []bool{false, true} {
							in := RestoreInput{
								Source: src, SourceScope: scope,
								SourceTemplateUID: "tmpl-a", ActorTemplateUID: "tmpl-a",
								FromData: policy, Golden: golden, ForceBoot: force,
							}
							if !sameTemplate {
								in.ActorTemplateUID = "tmpl-b"
							}
							name := fmt.Sprintf("%v/%v/same=%v/%v/golden=%q/boot=%v", src, scope, sameTemplate, policy, golden, force)
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
	if count != 3*2*2*2*2*2 {
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
	case in.SourceTemplateUID == in.ActorTemplateUID && in.SourceScope == torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL:
		want(t, scope == torporv1.RestoreScope_RESTORE_SCOPE_FULL && got.UseSource && !got.DiscardsMemory && got.Golden == "", "same template keeps a FULL source FULL", got)
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
