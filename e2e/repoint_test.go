package e2e

import (
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func (c *cluster) repoint(actor, template string, allowStateLoss bool) error {
	_, err := c.actors.UpdateActor(c.ctx, connect.NewRequest(&torporv1.UpdateActorRequest{
		Actor:          &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "default", Name: actor}, Spec: &torporv1.ActorSpec{Template: template}},
		UpdateMask:     &fieldmaskpb.FieldMask{Paths: []string{"spec.template"}},
		AllowStateLoss: allowStateLoss,
	}))
	return err
}

// lastReasons joins the reasons of the actor's latest n history entries.
func (c *cluster) lastReasons(actor string, n int) string {
	evs := c.events(actor)
	var rs []string
	for _, ev := range evs[max(0, len(evs)-n):] {
		rs = append(rs, ev.GetReason())
	}
	return strings.Join(rs, " | ")
}

func wantBody(t *testing.T, a *torporv1.Actor, want string) {
	t.Helper()
	if got := get(t, a); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestRepointWithoutDurableData: a FULL snapshot with no durable volumes
// holds state only in memory and the root filesystem; a repoint discards it,
// so it needs explicit consent, and then the actor starts afresh.
func TestRepointWithoutDurableData(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	noVolumes := func(s *torporv1.TemplateSpec) {
		s.Volumes = nil
		s.Containers[0].Mounts = nil
	}
	c.applyTemplate(counterTemplate(t, "a", noVolumes))
	c.applyTemplate(counterTemplate(t, "b", func(s *torporv1.TemplateSpec) {
		noVolumes(s)
		s.Containers[0].Env = append(s.Containers[0].Env, &torporv1.EnvVar{Name: "FLAVOUR", Value: "b"})
	}))
	c.createActor("c1", "a")
	a := c.mustResume("c1")
	wantBody(t, a, "count=1 lines=1")
	wantBody(t, a, "count=2 lines=2")
	c.suspend("c1")

	err := c.repoint("c1", "b", false)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "allow-state-loss") {
		t.Fatalf("repoint without consent: %v, want FailedPrecondition asking for --allow-state-loss", err)
	}
	if err := c.repoint("c1", "b", true); err != nil {
		t.Fatal(err)
	}
	wantBody(t, c.mustResume("c1"), "count=1 lines=1")
	if r := c.lastReasons("c1", 3); !strings.Contains(r, "all state discarded") || !strings.Contains(r, "discarded") {
		t.Fatalf("history does not say state was discarded: %s", r)
	}
}

// TestRepointOntoGoldenTemplate: the new template restores DATA on its own
// golden, and the durable file survives.
func TestRepointOntoGoldenTemplate(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	c.applyTemplate(counterTemplate(t, "a", nil))
	// b runs another program over a's layout (a policy alone would keep
	// the guest, and its memory).
	b := c.applyTemplate(counterTemplate(t, "b", func(s *torporv1.TemplateSpec) {
		s.Containers[0].Env = append(s.Containers[0].Env, &torporv1.EnvVar{Name: "FLAVOUR", Value: "b"})
		s.SnapshotPolicy = &torporv1.SnapshotPolicy{OnResume: &torporv1.OnResume{FromData: torporv1.FromData_FROM_DATA_GOLDEN}}
	}))
	c.createActor("c1", "a")
	a := c.mustResume("c1")
	for _, want := range []string{"count=1 lines=1", "count=2 lines=2", "count=3 lines=3"} {
		wantBody(t, a, want)
	}
	c.suspend("c1")
	if err := c.repoint("c1", "b", false); err != nil {
		t.Fatal(err)
	}
	r := c.mustResume("c1")
	if reason := c.lastReasons("c1", 2); !strings.Contains(reason, "DATA_ON_GOLDEN") || !strings.Contains(reason, b.GetStatus().GetGoldenSnapshot()) {
		t.Fatalf("resume after repoint: %s, want DATA_ON_GOLDEN on b's golden %s", reason, b.GetStatus().GetGoldenSnapshot())
	}
	// Memory is b's golden (a fresh counter), the file is the actor's.
	wantBody(t, r, "count=1 lines=4")
	if r.GetStatus().GetCurrentTemplateUid() != b.GetMetadata().GetUid() {
		t.Fatal("status does not record b as the template the guest runs")
	}
}

// TestRepointThenPauseRestoresFull: a paused actor's local checkpoint is
// compared with the template it was captured under, not with a stale
// durable snapshot's, so it restores FULL.
func TestRepointThenPauseRestoresFull(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	c.applyTemplate(counterTemplate(t, "a", nil))
	c.applyTemplate(counterTemplate(t, "b", func(s *torporv1.TemplateSpec) {
		s.Containers[0].Env = append(s.Containers[0].Env, &torporv1.EnvVar{Name: "FLAVOUR", Value: "b"})
	}))
	c.createActor("c1", "a")
	a := c.mustResume("c1")
	wantBody(t, a, "count=1 lines=1")
	wantBody(t, a, "count=2 lines=2")
	c.suspend("c1")
	if err := c.repoint("c1", "b", false); err != nil {
		t.Fatal(err)
	}
	r := c.mustResume("c1")
	wantBody(t, r, "count=1 lines=3") // DATA: fresh memory, kept file
	c.pause("c1")
	p := c.mustResume("c1")
	if reason := c.lastReasons("c1", 2); !strings.Contains(reason, "FULL from local checkpoint") {
		t.Fatalf("resume after pause: %s, want FULL from the local checkpoint", reason)
	}
	wantBody(t, p, "count=2 lines=4") // the counter survived the pause
}
