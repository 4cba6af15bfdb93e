package workflow

import (
	"context"
	"fmt"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// workloadEgress is the egress policy a workload of template spec runs
// under, for an actor of spec actor (nil: the template's own workload, a
// golden build or a warm sandbox): the template's, narrowed by the
// actor's, with an explicit mode (a template stored before policies
// existed has none and keeps ALLOW). Every Workload the engine sends a
// node takes its egress from here. An actor's policy that no longer lies
// within its template's is FailedPrecondition: nothing starts with a
// policy no one checked.
func workloadEgress(spec *torporv1.TemplateSpec, actor *torporv1.ActorSpec) (*torporv1.EgressPolicy, error) {
	eff, err := EffectiveEgress(spec, actor)
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "the actor's egress policy is not within its template's: %v", err)
	}
	return eff.Proto(), nil
}

// EffectiveEgress is workloadEgress's policy; its error, a FieldError,
// names the actor's rule its template's does not cover.
func EffectiveEgress(spec *torporv1.TemplateSpec, actor *torporv1.ActorSpec) (egress.Policy, error) {
	tmpl, err := egress.Parse(spec.GetEgress(), "template.spec.egress")
	if err != nil {
		return egress.Policy{}, err
	}
	own, err := egress.Parse(actor.GetEgress(), "spec.egress")
	if err != nil {
		return egress.Policy{}, err
	}
	return egress.Effective(tmpl, own, "spec.egress")
}

// checkActorEgress refuses a's spec (InvalidArgument naming the rule)
// when its egress policy does not lie within that of the template
// revision it names (read in tx): after a change of either the policy or
// the revision.
func checkActorEgress(ctx context.Context, tx store.Tx, a *torporv1.Actor) error {
	_, rev, err := Revision(ctx, tx, a.GetMetadata().GetSpace(), a.GetSpec().GetTemplate(), a.GetSpec().GetTemplateRevision())
	if err != nil {
		return fmt.Errorf("actor %s: its template revision: %w", actorKey(a), err)
	}
	if _, err := EffectiveEgress(rev.GetSpec(), a.GetSpec()); err != nil {
		return fmt.Errorf("actor %s on %s: %w", actorKey(a), rev.GetMetadata().GetName(), err)
	}
	return nil
}

// actorWorkload is the Workload of claimed actor a's start (a Run or a
// Restore): the template revision its claim recorded (invariant 8), under
// the egress policy of that revision and a's spec.
func actorWorkload(a *torporv1.Actor) (*torporv1.Workload, error) {
	st := a.GetStatus()
	policy, err := workloadEgress(st.GetCurrentTemplateSpec(), a.GetSpec())
	if err != nil {
		return nil, fmt.Errorf("actor %s: %w", actorKey(a), err)
	}
	return &torporv1.Workload{
		Space: a.GetMetadata().GetSpace(), Actor: a.GetMetadata().GetName(), ActorUid: a.GetMetadata().GetUid(),
		TemplateName: st.GetCurrentTemplate(), TemplateUid: st.GetCurrentTemplateUid(), Template: st.GetCurrentTemplateSpec(),
		Env: a.GetSpec().GetEnv(), EnvdAccessToken: a.GetSpec().GetEnvdAccessToken(), Envd: a.GetSpec().GetSandbox() != nil,
		Egress: policy,
	}, nil
}

// templateWorkload is the Workload of template revision t's own sandbox:
// its golden build (actor and actorUID set) or a warm sandbox (none).
func templateWorkload(t *torporv1.Template, actor, actorUID string) (*torporv1.Workload, error) {
	m := t.GetMetadata()
	policy, err := workloadEgress(t.GetSpec(), nil)
	if err != nil {
		return nil, fmt.Errorf("template %s/%s: %w", m.GetSpace(), m.GetName(), err)
	}
	return &torporv1.Workload{
		Space: m.GetSpace(), Actor: actor, ActorUid: actorUID, TemplateName: m.GetName(), TemplateUid: m.GetUid(), Template: t.GetSpec(),
		Egress: policy,
	}, nil
}
