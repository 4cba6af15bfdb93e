package workflow

import (
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
)

var (
	templateAllowlist = &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOWLIST, Rules: []*torporv1.EgressRule{
		{Host: "*.example.com", Ports: []string{"443"}, Protocol: torporv1.EgressProtocol_EGRESS_PROTOCOL_TCP},
	}}
	actorAllowlist = &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOWLIST, Rules: []*torporv1.EgressRule{
		{Host: "api.example.com", Ports: []string{"443"}, Protocol: torporv1.EgressProtocol_EGRESS_PROTOCOL_TCP},
	}}
	allowAll = &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOW}
)

// sentSince checks that every workload of template the agent was sent
// from index from on carries want, and returns the methods that sent them.
func sentSince(t *testing.T, f *fakeAgent, from int, template string, want *torporv1.EgressPolicy) []string {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	var methods []string
	for _, s := range f.workloads[from:] {
		if !strings.HasPrefix(s.workload.GetTemplateName(), template+"@") {
			continue
		}
		methods = append(methods, s.method)
		if !proto.Equal(s.workload.GetEgress(), want) {
			t.Errorf("%s of %s/%s carries egress %v, want %v", s.method, s.workload.GetSpace(), s.workload.GetActor(), s.workload.GetEgress(), want)
		}
	}
	return methods
}

// TestEveryStartCarriesTheEffectivePolicy: the golden build and the warm
// sandboxes of a template carry its policy; a cold boot, a restore and a
// restart of an actor carry the effective policy (the template's narrowed
// by the actor's), and a RUNNING actor's status shows it. A template
// stored without a policy (before policies existed) starts with ALLOW.
func TestEveryStartCarriesTheEffectivePolicy(t *testing.T) {
	e := newEnv(t, 4, "n1")
	agent := e.agents["n1"]
	e.createTemplateSpec("hot", &torporv1.TemplateSpec{
		SandboxClass: "gvisor", Containers: []*torporv1.Container{{Name: "main", Image: "img"}}, WarmWorkers: 1, Egress: templateAllowlist,
	}, torporv1.FromData_FROM_DATA_GOLDEN)
	if err := e.engine.BuildGoldens(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.sweep()
	if got := sentSince(t, agent, 0, "hot", templateAllowlist); len(got) != 2 || got[0] != "Run" || got[1] != "Warm" {
		t.Fatalf("the template's own starts: %v, want its golden build (Run) and a Warm", got)
	}

	mark := len(agent.workloads)
	e.createActorOn("narrow", "hot")
	a := e.actor("narrow")
	a.Spec.Egress = actorAllowlist
	if _, err := e.store.Actors().Update(e.ctx, a); err != nil {
		t.Fatal(err)
	}
	if st := e.resume("narrow", ResumeOptions{}).GetStatus(); !proto.Equal(st.GetEgress(), actorAllowlist) {
		t.Errorf("RUNNING actor's status.egress = %v, want the actor's allowlist", st.GetEgress())
	}
	e.suspend("narrow")
	e.resume("narrow", ResumeOptions{})
	if got := sentSince(t, agent, mark, "hot", actorAllowlist); len(got) != 2 || got[0] != "Restore" || got[1] != "Restore" {
		t.Fatalf("the actor's starts: %v, want two restores (on golden, from its snapshot)", got)
	}

	mark = len(agent.workloads)
	e.createActor("legacy") // on "counter", stored without a policy
	if st := e.resume("legacy", ResumeOptions{Boot: true}).GetStatus(); !proto.Equal(st.GetEgress(), allowAll) {
		t.Errorf("legacy actor's status.egress = %v, want ALLOW", st.GetEgress())
	}
	if got := sentSince(t, agent, mark, "counter", allowAll); len(got) != 1 || got[0] != "Run" {
		t.Fatalf("the legacy actor's starts: %v, want a cold boot (Run)", got)
	}
}

// TestActorWiderThanItsTemplateDoesNotStart: an actor whose policy is no
// longer within its template revision's (written around the API's check)
// is refused at its start, and nothing is sent to the node.
func TestActorWiderThanItsTemplateDoesNotStart(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createTemplateSpec("closed", &torporv1.TemplateSpec{
		SandboxClass: "gvisor", Containers: []*torporv1.Container{{Name: "main", Image: "img"}},
		Egress: egress.Policy{Mode: egress.Deny}.Proto(),
	}, torporv1.FromData_FROM_DATA_COLD_BOOT)
	e.createActorOn("wide", "closed")
	a := e.actor("wide")
	a.Spec.Egress = allowAll
	if _, err := e.store.Actors().Update(e.ctx, a); err != nil {
		t.Fatal(err)
	}
	_, err := e.engine.Resume(e.ctx, "default", "wide", ResumeOptions{Boot: true})
	if err == nil || !regexp.MustCompile(`not within its template's`).MatchString(err.Error()) {
		t.Fatalf("resume of an actor wider than its template: %v, want refused naming the policy", err)
	}
	if n := len(e.agents["n1"].workloads); n != 0 {
		t.Fatalf("%d workloads sent to the node, want none", n)
	}
}

// TestReportEgressDenied: sampled refusals become events of the actor
// that runs the workload, naming protocol, destination, port (the name
// for dns) and the count; a report of a workload the actor no longer
// runs writes nothing.
func TestReportEgressDenied(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	a := e.resume("c1", ResumeOptions{Boot: true})
	w, op, uid := a.GetStatus().GetWorker().GetName(), a.GetStatus().GetRunOperation(), a.GetMetadata().GetUid()
	samples := []*torporv1.EgressDenial{
		{Time: timestamppb.Now(), Protocol: "tcp", Destination: "198.51.100.7", Port: 25},
		{Time: timestamppb.Now(), Protocol: "dns", Destination: "evil.example.net"},
	}
	if err := e.engine.ReportEgressDenied(e.ctx, "n1", w, uid, "op-other", 2, samples); err != nil {
		t.Fatal(err)
	}
	if e.hasEventMatching("c1", regexp.MustCompile(EgressDeniedReason)) {
		t.Fatal("a report of another operation's workload was recorded")
	}
	if err := e.engine.ReportEgressDenied(e.ctx, "n2", w, uid, op, 2, samples); err == nil {
		t.Fatal("a report for another node's worker was taken")
	}
	if err := e.engine.ReportEgressDenied(e.ctx, "n1", w, uid, op, 7, samples); err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`^EgressDenied: tcp to 198\.51\.100\.7 port 25 refused by the egress policy \(7 refused since the last report\)$`,
		`^EgressDenied: name evil\.example\.net refused by the egress policy \(7 refused`,
	} {
		if !e.hasEventMatching("c1", regexp.MustCompile(re)) {
			t.Errorf("no event matches %s: %s", re, e.eventReasons("default", "c1"))
		}
	}
	wantState(t, e.actor("c1"), torporv1.ActorState_ACTOR_STATE_RUNNING)
}
