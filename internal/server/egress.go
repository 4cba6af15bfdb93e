package server

import (
	"context"
	"fmt"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// Egress policies at the API's edge: a template's and an actor's are
// parsed and normalized here, and a space token's are held to its space's
// bounds (an administrator's are not bounded). What a policy means, and
// whether an actor's lies within its template's, is internal/egress's.

// spaceToken reports whether the caller is bounded by its spaces' egress
// bounds: an API token or user client of some spaces, not an
// administrator.
func spaceToken(ctx context.Context) bool {
	spaces, ok := visibleSpaces(ctx)
	return ok && spaces != nil
}

// admitEgress parses the policy p at field of a record in space, and,
// for a space token, checks it against the space's bounds.
func admitEgress(ctx context.Context, st store.Store, space string, p *torporv1.EgressPolicy, field string) (egress.Policy, error) {
	policy, err := egress.Parse(p, field)
	if err != nil {
		return egress.Policy{}, err
	}
	if !spaceToken(ctx) {
		return policy, nil
	}
	sp, err := st.Spaces().Get(ctx, "", space)
	if isNotFound(err) {
		return egress.Policy{}, failedPrecondition("space %q does not exist", space)
	}
	if err != nil {
		return egress.Policy{}, fmt.Errorf("space %s: read its egress bounds: %w", space, err)
	}
	bounds, err := egress.ParseBounds(sp.GetSpec().GetEgressBounds(), "spec.egressBounds")
	if err != nil {
		return egress.Policy{}, fmt.Errorf("space %s: its stored egress bounds: %w", space, err)
	}
	if err := bounds.Admit(policy, field, space); err != nil {
		return egress.Policy{}, err
	}
	return policy, nil
}

// templateEgress is the policy a template applied as spec is stored with:
// the one it names, normalized, or DENY when it names none: a sandbox
// reaches nothing until its template says so. The exception is the legacy
// rule: when the template's latest revision was stored before egress
// policies existed (it has none, so it runs with ALLOW) and the apply
// names none either, the new spec keeps none, so an unchanged re-apply
// stays a no-op and an unrelated change does not cut the template's
// actors off the network; setting spec.egress is how such a template
// opts in.
func templateEgress(ctx context.Context, tx store.Tx, meta *torporv1.ObjectMeta, policy egress.Policy) (*torporv1.EgressPolicy, error) {
	if policy.Mode != egress.Unset {
		return policy.Proto(), nil
	}
	_, latest, err := workflow.Revision(ctx, tx, meta.GetSpace(), meta.GetName(), 0)
	switch {
	case isNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("template %s/%s: latest revision: %w", meta.GetSpace(), meta.GetName(), err)
	case latest.GetSpec().GetEgress() == nil:
		return nil, nil
	}
	return egress.Policy{Mode: egress.Deny}.Proto(), nil
}

// actorEgress checks an actor's policy p against its template revision's
// (an actor may only narrow it) and returns p normalized.
func actorEgress(rev *torporv1.Template, p egress.Policy) (*torporv1.EgressPolicy, error) {
	if _, err := workflow.EffectiveEgress(rev.GetSpec(), &torporv1.ActorSpec{Egress: p.Proto()}); err != nil {
		return nil, fmt.Errorf("template %s: %w", rev.GetMetadata().GetName(), err)
	}
	return p.Proto(), nil
}
