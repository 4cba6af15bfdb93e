package server

import (
	"context"
	"fmt"
	"io"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

func withEgress(name string, p *torporv1.EgressPolicy) *torporv1.Template {
	t := counterTemplate(name)
	t.Spec.Egress = p
	return t
}

func allowlist(rules ...*torporv1.EgressRule) *torporv1.EgressPolicy {
	return &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOWLIST, Rules: rules}
}

var denyPolicy = &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_DENY}

// forBackends runs test on a server over SQLite and over PostgreSQL.
func forBackends(t *testing.T, test func(t *testing.T, r *replica)) {
	for _, backend := range storetest.Backends {
		t.Run(backend, func(t *testing.T) { test(t, startReplica(t, storetest.URL(t, backend), io.Discard)) })
	}
}

// TestTemplateEgressDefaults: a template applied without a policy is
// stored with DENY, and applying it again changes nothing; a policy is
// stored normalized (an identical apply of it changes nothing either); a
// template stored before policies existed keeps none through an unchanged
// re-apply and through an unrelated change (the legacy rule).
func TestTemplateEgressDefaults(t *testing.T) {
	forBackends(t, func(t *testing.T, r *replica) {
		c := r.clients(r.admin(t))
		first := c.apply(t, counterTemplate("plain"))
		if !proto.Equal(first.GetSpec().GetEgress(), denyPolicy) {
			t.Fatalf("applied without a policy: egress %v, want DENY", first.GetSpec().GetEgress())
		}
		if again := c.apply(t, counterTemplate("plain")); again.GetStatus().GetRevision() != 1 {
			t.Fatalf("re-apply without a policy made revision %d, want still 1", again.GetStatus().GetRevision())
		}

		loose := allowlist(&torporv1.EgressRule{Host: "API.Example.com.", Ports: []string{"8443", "443"}})
		listed := c.apply(t, withEgress("listed", loose))
		want := allowlist(&torporv1.EgressRule{Host: "api.example.com", Ports: []string{"443", "8443"}, Protocol: torporv1.EgressProtocol_EGRESS_PROTOCOL_TCP})
		if !proto.Equal(listed.GetSpec().GetEgress(), want) {
			t.Fatalf("stored %v, want normalized %v", listed.GetSpec().GetEgress(), want)
		}
		if again := c.apply(t, withEgress("listed", loose)); again.GetStatus().GetRevision() != 1 {
			t.Fatalf("re-apply of the same policy made revision %d, want still 1", again.GetStatus().GetRevision())
		}

		// A revision written before policies existed: no egress.
		c.apply(t, counterTemplate("old"))
		rev, err := r.store.Revisions().Get(context.Background(), "default", "old@1")
		if err != nil {
			t.Fatal(err)
		}
		rev.Spec.Egress = nil
		if _, err := r.store.Revisions().Update(context.Background(), rev); err != nil {
			t.Fatal(err)
		}
		if again := c.apply(t, counterTemplate("old")); again.GetStatus().GetRevision() != 1 || again.GetSpec().GetEgress() != nil {
			t.Fatalf("re-apply of a template stored without a policy: revision %d egress %v, want revision 1 without one", again.GetStatus().GetRevision(), again.GetSpec().GetEgress())
		}
		changed := counterTemplate("old")
		changed.Spec.Containers[0].Args = []string{"--verbose"}
		if next := c.apply(t, changed); next.GetStatus().GetRevision() != 2 || next.GetSpec().GetEgress() != nil {
			t.Fatalf("an unrelated change of a template stored without a policy: revision %d egress %v, want revision 2 still without one (ALLOW)", next.GetStatus().GetRevision(), next.GetSpec().GetEgress())
		}
		if next := c.apply(t, withEgress("old", denyPolicy)); next.GetStatus().GetRevision() != 3 || !proto.Equal(next.GetSpec().GetEgress(), denyPolicy) {
			t.Fatalf("opting in: revision %d egress %v, want revision 3 with DENY", next.GetStatus().GetRevision(), next.GetSpec().GetEgress())
		}
	})
}

// TestSpaceTokenEgressRefusedAtApply: hostile policies a space token
// applies are each refused, InvalidArgument naming the rule, and nothing
// is written; within its space's bounds an apply goes through, and an
// administrator is not bounded.
func TestSpaceTokenEgressRefusedAtApply(t *testing.T) {
	forBackends(t, func(t *testing.T, r *replica) {
		ctx := context.Background()
		admin := r.clients(r.admin(t))
		if _, err := admin.spaces.CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{Space: &torporv1.Space{
			Metadata: &torporv1.ObjectMeta{Name: "tenant"},
			Spec:     &torporv1.SpaceSpec{EgressBounds: &torporv1.EgressBounds{Hosts: []string{"*.example.com"}, Cidrs: []string{"203.0.113.0/24"}}},
		}})); err != nil {
			t.Fatal(err)
		}
		tenant := r.clients(testClient(t, r.roots, nil, r.apiToken(t, "tenant")))
		many := make([]*torporv1.EgressRule, 10_000)
		for i := range many {
			many[i] = &torporv1.EgressRule{Host: fmt.Sprintf("h%d.example.com", i)}
		}
		for _, tc := range []struct {
			name   string
			policy *torporv1.EgressPolicy
			path   string
		}{
			{"the whole internet as a range", allowlist(&torporv1.EgressRule{Host: "api.example.com"}, &torporv1.EgressRule{Cidr: "0.0.0.0/0"}), "spec.egress.rules[1].cidr"},
			{"allow", &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOW}, "spec.egress.mode"},
			{"a name outside the bounds", allowlist(&torporv1.EgressRule{Host: "api.example.org"}), "spec.egress.rules[0].host"},
			{"a range outside the bounds", allowlist(&torporv1.EgressRule{Cidr: "198.51.100.0/24"}), "spec.egress.rules[0].cidr"},
			{"a private range", allowlist(&torporv1.EgressRule{Cidr: "10.0.0.0/8"}), "spec.egress.rules[0].cidr"},
			{"a malformed range", allowlist(&torporv1.EgressRule{Cidr: "203.0.113.300/24"}), "spec.egress.rules[0].cidr"},
			{"a wildcard in the middle", allowlist(&torporv1.EgressRule{Host: "api.*.example.com"}), "spec.egress.rules[0].host"},
			{"10,000 rules", allowlist(many...), "spec.egress.rules"},
		} {
			_, err := tenant.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: withEgressIn("tenant", "bad", tc.policy)}))
			wantCode(t, err, connect.CodeInvalidArgument, tc.path)
			if _, err := admin.templates.GetTemplate(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "tenant", Name: "bad"})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("%s: after the refusal the template reads %v, want not found", tc.name, err)
			}
		}
		inside := allowlist(&torporv1.EgressRule{Host: "api.example.com", Ports: []string{"443"}}, &torporv1.EgressRule{Cidr: "203.0.113.7"})
		if _, err := tenant.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: withEgressIn("tenant", "good", inside)})); err != nil {
			t.Fatalf("a policy within the bounds: %v", err)
		}
		if _, err := admin.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: withEgressIn("tenant", "wide", &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOW})})); err != nil {
			t.Fatalf("an administrator's ALLOW: %v", err)
		}
		// An actor may narrow its template's policy, not widen it, and a
		// space token's actor stays within the bounds too.
		createActor := func(c clients, name, template string, p *torporv1.EgressPolicy) error {
			_, err := c.actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
				Metadata: &torporv1.ObjectMeta{Space: "tenant", Name: name}, Spec: &torporv1.ActorSpec{Template: template, Egress: p},
			}}))
			return err
		}
		wantCode(t, createActor(admin, "a1", "good", allowlist(&torporv1.EgressRule{Host: "api.example.com", Ports: []string{"80"}})), connect.CodeInvalidArgument, "spec.egress.rules[0]")
		wantCode(t, createActor(tenant, "a2", "wide", &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOW}), connect.CodeInvalidArgument, "spec.egress.mode")
		if err := createActor(tenant, "a3", "good", allowlist(&torporv1.EgressRule{Host: "api.example.com", Ports: []string{"443"}})); err != nil {
			t.Fatalf("an actor narrowing its template: %v", err)
		}
		_, err := tenant.actors.UpdateActor(ctx, connect.NewRequest(&torporv1.UpdateActorRequest{
			Actor:      &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "tenant", Name: "a3"}, Spec: &torporv1.ActorSpec{Egress: allowlist(&torporv1.EgressRule{Cidr: "203.0.113.0/24"})}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.egress"}},
		}))
		wantCode(t, err, connect.CodeInvalidArgument, "spec.egress.rules[0]")
		updated, err := tenant.actors.UpdateActor(ctx, connect.NewRequest(&torporv1.UpdateActorRequest{
			Actor:      &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "tenant", Name: "a3"}, Spec: &torporv1.ActorSpec{Egress: denyPolicy}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.egress"}},
		}))
		if err != nil || !proto.Equal(updated.Msg.GetSpec().GetEgress(), denyPolicy) {
			t.Fatalf("narrowing an actor to DENY: %v %v", updated, err)
		}
	})
}

func withEgressIn(space, name string, p *torporv1.EgressPolicy) *torporv1.Template {
	t := withEgress(name, p)
	t.Metadata.Space = space
	return t
}

// TestUpdateSpaceBounds: an administrator sets a space's bounds at create
// and replaces them with UpdateSpace (conditional on the version when
// given), GetSpace shows them, malformed bounds are refused naming the
// field, and a space token may not change them.
func TestUpdateSpaceBounds(t *testing.T) {
	forBackends(t, func(t *testing.T, r *replica) {
		ctx := context.Background()
		admin := r.clients(r.admin(t))
		created, err := admin.spaces.CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{Space: &torporv1.Space{
			Metadata: &torporv1.ObjectMeta{Name: "tenant"}, Spec: &torporv1.SpaceSpec{EgressBounds: &torporv1.EgressBounds{Hosts: []string{"*.example.com"}}},
		}}))
		if err != nil {
			t.Fatal(err)
		}
		_, err = admin.spaces.CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{Space: &torporv1.Space{
			Metadata: &torporv1.ObjectMeta{Name: "other"}, Spec: &torporv1.SpaceSpec{EgressBounds: &torporv1.EgressBounds{Cidrs: []string{"10.0.0.1/8"}}},
		}}))
		wantCode(t, err, connect.CodeInvalidArgument, "spec.egressBounds.cidrs[0]")
		update := func(c clients, version int64, b *torporv1.EgressBounds) (*torporv1.Space, error) {
			resp, err := c.spaces.UpdateSpace(ctx, connect.NewRequest(&torporv1.UpdateSpaceRequest{Space: &torporv1.Space{
				Metadata: &torporv1.ObjectMeta{Name: "tenant", Version: version}, Spec: &torporv1.SpaceSpec{EgressBounds: b},
			}}))
			if err != nil {
				return nil, err
			}
			return resp.Msg, nil
		}
		wide := &torporv1.EgressBounds{AllowAny: true}
		_, err = update(r.clients(testClient(t, r.roots, nil, r.apiToken(t, "tenant"))), 0, wide)
		wantCode(t, err, connect.CodePermissionDenied, "admin")
		_, err = update(admin, created.Msg.GetMetadata().GetVersion()+1, wide)
		wantCode(t, err, connect.CodeAborted, "version")
		_, err = update(admin, 0, &torporv1.EgressBounds{Hosts: []string{"a.*.example.com"}})
		wantCode(t, err, connect.CodeInvalidArgument, "spec.egressBounds.hosts[0]")
		if _, err := update(admin, created.Msg.GetMetadata().GetVersion(), wide); err != nil {
			t.Fatal(err)
		}
		got, err := admin.spaces.GetSpace(ctx, connect.NewRequest(&torporv1.GetRequest{Name: "tenant"}))
		if err != nil || !proto.Equal(got.Msg.GetSpec().GetEgressBounds(), wide) {
			t.Fatalf("GetSpace after the update: %v %v, want bounds %v", got, err, wide)
		}
	})
}

// TestReportEgressDeniedIsBounded: only a node reports refusals, for its
// own workers; a report with more samples than a report may carry, or a
// sample that is not a refusal, is refused whole; a report of a workload
// no actor runs is taken and writes nothing.
func TestReportEgressDeniedIsBounded(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, storetest.URL(t, "sqlite"), io.Discard)
	node := torporv1connect.NewNodeServiceClient(r.httpClient(t, joinNode(t, r, r, "n1")), r.url)
	sample := func() *torporv1.EgressDenial {
		return &torporv1.EgressDenial{Time: timestamppb.Now(), Protocol: "tcp", Destination: "198.51.100.7", Port: 443}
	}
	report := func(c torporv1connect.NodeServiceClient, nodeName string, samples ...*torporv1.EgressDenial) error {
		_, err := c.ReportEgressDenied(ctx, connect.NewRequest(&torporv1.ReportEgressDeniedRequest{
			Node: nodeName, Worker: "n1-w0", ActorUid: "uid-1", OperationId: "op-1", Count: int64(len(samples)) + 3, Samples: samples,
		}))
		return err
	}
	six := []*torporv1.EgressDenial{sample(), sample(), sample(), sample(), sample(), sample()}
	wantCode(t, report(node, "n1", six...), connect.CodeInvalidArgument, "samples: 6 samples, at most 5")
	bad := sample()
	bad.Destination = "a\nb"
	wantCode(t, report(node, "n1", sample(), bad), connect.CodeInvalidArgument, "samples[1].destination")
	wantCode(t, report(node, "n2", sample()), connect.CodePermissionDenied, "n2")
	wantCode(t, report(torporv1connect.NewNodeServiceClient(r.admin(t), r.url), "n1", sample()), connect.CodeUnauthenticated, "node certificate")
	if err := report(node, "n1", sample()); err != nil {
		t.Fatalf("a report of a workload no actor runs: %v, want taken (and ignored)", err)
	}
}
