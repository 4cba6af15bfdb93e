package e2e

import (
	"net/http"
	"regexp"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// whoamiPattern is the counter's /whoami answer for actor c1.
var whoamiPattern = regexp.MustCompile(`^spiffe://torpor\.local/space/default/actor/c1 serial=([0-9a-f]+)$`)

// whoami asks actor, through the router, for the identity its node agent
// gave it, and returns the certificate's serial.
func (c *cluster) whoami(actor string) string {
	c.t.Helper()
	code, _, answer := c.routerGetPath(actor, "/whoami")
	m := whoamiPattern.FindStringSubmatch(answer)
	if code != http.StatusOK || m == nil {
		c.t.Fatalf("GET /whoami of %s: %d %q, want 200 and %s", actor, code, answer, whoamiPattern)
	}
	return m[1]
}

// TestActorIdentityThroughSuspendAndResume: an actor reads its SPIFFE ID
// from the certificate its node minted before it started; after the
// control plane suspended it for idleness, the next request resumes it on another
// node with a new certificate (never the one in its snapshot) and its
// memory back.
func TestActorIdentityThroughSuspendAndResume(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", nodes: 2, workersPerNode: 1})
	c.applyTemplate(counterTemplate(t, "counter", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 3, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND}
	}))
	c.createActor("c1", "counter")

	first := c.whoami("c1") // resumes c1 from the golden image
	if code, _, body := c.routerGet("c1"); code != http.StatusOK || body != "count=1 lines=1" {
		t.Fatalf("GET / of c1: %d %q, want count=1 lines=1", code, body)
	}
	if again := c.whoami("c1"); again != first {
		t.Fatalf("serial changed from %s to %s while c1 ran (a renewal is due only at half its hour)", first, again)
	}
	node := c.actor("c1").GetStatus().GetWorker().GetNode()

	c.waitFor("the control plane to suspend idle c1", func() bool {
		return c.actor("c1").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_SUSPENDED
	})
	// The holder, resumed through the API just now, is not idle for its
	// 3s before c1's resume, and keeps its worker.
	c.holdWorkerOf(node, "counter")
	resumed := c.whoami("c1")
	if moved := c.actor("c1").GetStatus().GetWorker().GetNode(); moved == node {
		t.Fatalf("c1 resumed on node %s again, want the other node", node)
	}
	if resumed == first {
		t.Fatalf("c1 resumed with serial %s, the certificate it was suspended with", first)
	}
	// A FULL restore: memory came back with the new identity.
	if code, _, body := c.routerGet("c1"); code != http.StatusOK || body != "count=2 lines=2" {
		t.Fatalf("GET / of c1 after the resume: %d %q, want count=2 lines=2", code, body)
	}
	c.checkReciprocal()
}
