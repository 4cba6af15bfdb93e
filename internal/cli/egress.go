package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
)

// effectiveEgress says under which egress policy actor a runs: the one its
// running workload was started with (status.egress), else the one its
// next start would use, its template revision's narrowed by its own.
func effectiveEgress(ctx context.Context, c *clients, a *torporv1.Actor) string {
	if p := a.GetStatus().GetEgress(); p != nil && a.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING {
		return describeEgress(p) + " (the running workload's)"
	}
	m, spec := a.GetMetadata(), a.GetSpec()
	ref := spec.GetTemplate()
	if rev := spec.GetTemplateRevision(); rev != 0 {
		ref = fmt.Sprintf("%s@%d", ref, rev)
	}
	t, err := call(ctx, c.templates.GetTemplate, &torporv1.GetRequest{Space: m.GetSpace(), Name: ref})
	if err != nil {
		return fmt.Sprintf("unknown (template %s: %v)", ref, err)
	}
	tmpl, err := egress.Parse(t.GetSpec().GetEgress(), "template.spec.egress")
	if err != nil {
		return fmt.Sprintf("unknown (template %s: %v)", ref, err)
	}
	own, err := egress.Parse(spec.GetEgress(), "spec.egress")
	if err != nil {
		return fmt.Sprintf("unknown: %v", err)
	}
	eff, err := egress.Effective(tmpl, own, "spec.egress")
	if err != nil {
		return fmt.Sprintf("none: the next start is refused (%v)", err)
	}
	note := " (on the next start)"
	if t.GetSpec().GetEgress() == nil {
		note = " (on the next start; template " + ref + " predates egress policies, so it allows: set its spec.egress)"
	}
	return describeEgress(eff.Proto()) + note
}

// describeEgress is a policy on one line: its mode, and an allowlist's
// rules.
func describeEgress(p *torporv1.EgressPolicy) string {
	policy, err := egress.Parse(p, "egress")
	if err != nil {
		return fmt.Sprintf("invalid (%v)", err)
	}
	if policy.Mode != egress.Allowlist {
		return policy.Mode.String()
	}
	rules := make([]string, len(policy.Rules))
	for i, r := range policy.Rules {
		rules[i] = r.String()
	}
	return "allowlist: " + strings.Join(rules, ", ")
}

// boundsFlags set a space's egress bounds (SpaceSpec.egress_bounds).
type boundsFlags struct {
	allowAny bool
	hosts    []string
	cidrs    []string
}

func (f *boundsFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.allowAny, "egress-allow-any", false, "the space's templates and actors may allow every public address (egress mode ALLOW)")
	cmd.Flags().StringSliceVar(&f.hosts, "egress-host", nil, "a host name pattern (api.example.com or *.example.com) rules may name; repeat or comma-separate; none: any name")
	cmd.Flags().StringSliceVar(&f.cidrs, "egress-cidr", nil, "a range (203.0.113.0/24) address rules must lie within; repeat or comma-separate; none: no address rules")
}

func (f *boundsFlags) spec() *torporv1.SpaceSpec {
	if !f.allowAny && len(f.hosts) == 0 && len(f.cidrs) == 0 {
		return nil
	}
	return &torporv1.SpaceSpec{EgressBounds: &torporv1.EgressBounds{AllowAny: f.allowAny, Hosts: f.hosts, Cidrs: f.cidrs}}
}
