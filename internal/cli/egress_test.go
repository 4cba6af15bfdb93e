package cli

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// TestActorDescribeShowsTheEgressOfItsNextStart: an actor that does not
// run shows the policy its next start would use: its template's narrowed
// by its own, or the template's ALLOW when the template predates
// policies.
func TestActorDescribeShowsTheEgressOfItsNextStart(t *testing.T) {
	isolate(t)
	fake, url := startFakeAPI(t)
	fake.templates.put(&torporv1.Template{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "open"},
		Spec: &torporv1.TemplateSpec{Egress: &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOWLIST, Rules: []*torporv1.EgressRule{
			{Host: "*.example.com", Ports: []string{"443"}},
		}}},
	})
	fake.templates.put(&torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "old"}, Spec: &torporv1.TemplateSpec{}})
	suspended := &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED}
	fake.actors.put(&torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "narrow"}, Status: suspended, Spec: &torporv1.ActorSpec{
		Template: "open", Egress: &torporv1.EgressPolicy{Rules: []*torporv1.EgressRule{{Host: "api.example.com", Ports: []string{"443"}}}},
	}})
	fake.actors.put(&torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "legacy"}, Status: suspended, Spec: &torporv1.ActorSpec{Template: "old"}})
	for name, want := range map[string]string{
		"narrow": "Egress:  allowlist: tcp api.example.com:443 (on the next start)\n",
		"legacy": "Egress:  allow (on the next start; template old predates egress policies, so it allows: set its spec.egress)\n",
	} {
		if got := ok(t, url, "actor", "describe", name); !strings.Contains(got, want) {
			t.Errorf("describe %s:\n%s\nwant a line %q", name, got, want)
		}
	}
}

// TestSpaceEgressBounds: space create takes a space's egress bounds as
// flags, and space update replaces them whole (none: the default bounds).
func TestSpaceEgressBounds(t *testing.T) {
	isolate(t)
	fake, url := startFakeAPI(t)
	bounds := func(name string) *torporv1.EgressBounds {
		t.Helper()
		sp, err := fake.spaces.get("", name)
		if err != nil {
			t.Fatal(err)
		}
		return sp.GetSpec().GetEgressBounds()
	}
	ok(t, url, "space", "create", "team-b", "--egress-host", "*.example.com,api.example.org", "--egress-cidr", "203.0.113.0/24")
	want := &torporv1.EgressBounds{Hosts: []string{"*.example.com", "api.example.org"}, Cidrs: []string{"203.0.113.0/24"}}
	if got := bounds("team-b"); !proto.Equal(got, want) {
		t.Fatalf("created with bounds %v, want %v", got, want)
	}
	equalText(t, "update", ok(t, url, "space", "update", "team-b", "--egress-allow-any"), "space/team-b updated\n")
	if got := bounds("team-b"); !proto.Equal(got, &torporv1.EgressBounds{AllowAny: true}) {
		t.Fatalf("updated to bounds %v, want allowAny only", got)
	}
	ok(t, url, "space", "update", "team-b")
	if got := bounds("team-b"); got != nil {
		t.Fatalf("updated without flags: bounds %v, want the default (none)", got)
	}
}
