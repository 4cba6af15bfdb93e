package e2e

import (
	"strings"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// TestReapplyIdenticalTemplate is the first silent loss of issue 12: the
// template an actor uses cannot be deleted, and applying the same YAML
// again leaves it as it is, so the actor's next resume restores its memory
// (the count goes on), not a fresh guest on a template with a new uid.
func TestReapplyIdenticalTemplate(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	first := c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	a := c.mustResume("c1")
	wantBody(t, a, "count=1 lines=1")
	wantBody(t, a, "count=2 lines=2")
	c.suspend("c1")

	_, err := c.templates.DeleteTemplate(c.ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: "default", Name: "counter"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "counter@1 is used by 1 actor(s) (c1)") {
		t.Fatalf("delete of the template c1 uses: %v, want FailedPrecondition naming c1", err)
	}
	again := c.applyTemplate(counterTemplate(t, "counter", nil))
	if again.GetMetadata().GetUid() != first.GetMetadata().GetUid() || again.GetStatus().GetRevision() != 1 {
		t.Fatalf("identical apply made %v revision %d, want the same uid %s at revision 1",
			again.GetMetadata().GetUid(), again.GetStatus().GetRevision(), first.GetMetadata().GetUid())
	}
	r := c.mustResume("c1")
	wantBody(t, r, "count=3 lines=3")
	if reason := c.lastReasons("c1", 2); !strings.Contains(reason, "FULL") {
		t.Fatalf("resume after an identical apply: %s, want FULL", reason)
	}
}

// TestReapplyWithoutVolume is the second: applying the name with its
// durable volume removed makes a new revision; the actor stays on its own
// and keeps its files and memory, and moving it to the new revision is
// refused naming the volume unless the loss is accepted, which its history
// then says.
func TestReapplyWithoutVolume(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	a := c.mustResume("c1")
	wantBody(t, a, "count=1 lines=1")
	wantBody(t, a, "count=2 lines=2")
	c.suspend("c1")

	second := c.applyTemplate(counterTemplate(t, "counter", func(s *torporv1.TemplateSpec) {
		s.Volumes = nil
		s.Containers[0].Mounts = nil
	}))
	if second.GetStatus().GetRevision() != 2 {
		t.Fatalf("apply without the volume: revision %d, want 2", second.GetStatus().GetRevision())
	}
	r := c.mustResume("c1")
	if got := r.GetSpec().GetTemplateRevision(); got != 1 {
		t.Fatalf("actor moved to revision %d by an apply", got)
	}
	wantBody(t, r, "count=3 lines=3")
	c.suspend("c1")

	err := c.repoint("c1", "counter", false)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), `volume "data" is missing`) || !strings.Contains(err.Error(), "allow-state-loss") {
		t.Fatalf("move to the revision without the volume: %v, want FailedPrecondition naming volume \"data\"", err)
	}
	wantBody(t, c.mustResume("c1"), "count=4 lines=4")
	c.suspend("c1")

	if err := c.repoint("c1", "counter", true); err != nil {
		t.Fatal(err)
	}
	moved := c.mustResume("c1")
	if moved.GetSpec().GetTemplateRevision() != 2 || moved.GetStatus().GetCurrentTemplateUid() != second.GetMetadata().GetUid() {
		t.Fatalf("after the accepted move: spec %v, running %s", moved.GetSpec(), moved.GetStatus().GetCurrentTemplate())
	}
	wantBody(t, moved, "count=1 lines=1")
	if reason := c.lastReasons("c1", 3); !strings.Contains(reason, `state loss accepted: volume "data" is missing`) {
		t.Fatalf("history does not record the accepted loss: %s", reason)
	}
}

// TestPolicyRevisionKeepsMemory: a new revision that changes only the idle
// policy runs the same guest, so an actor moved to it keeps its memory (the
// count goes on) instead of restarting for a timeout change.
func TestPolicyRevisionKeepsMemory(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	a := c.mustResume("c1")
	wantBody(t, a, "count=1 lines=1")
	wantBody(t, a, "count=2 lines=2")
	c.suspend("c1")

	second := c.applyTemplate(counterTemplate(t, "counter", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 3600, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND}
	}))
	if second.GetStatus().GetRevision() != 2 {
		t.Fatalf("apply with another idle policy: revision %d, want 2", second.GetStatus().GetRevision())
	}
	if err := c.repoint("c1", "counter", false); err != nil {
		t.Fatal(err)
	}
	moved := c.mustResume("c1")
	if moved.GetStatus().GetCurrentTemplateUid() != second.GetMetadata().GetUid() {
		t.Fatalf("after the move the guest runs %s, want revision 2", moved.GetStatus().GetCurrentTemplate())
	}
	wantBody(t, moved, "count=3 lines=3")
	if reason := c.lastReasons("c1", 2); !strings.Contains(reason, "FULL") {
		t.Fatalf("resume on the policy-only revision: %s, want FULL", reason)
	}
}
