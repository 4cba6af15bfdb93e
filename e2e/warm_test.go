package e2e

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/node"
)

// resumePhases and suspendPhases match a resume's and a suspend's event's
// account of where its time went (workflow.resumedReason, stepsText) on a
// real node; the counter has a durable volume, archived.
var (
	resumePhases  = regexp.MustCompile(`\); claim [0-9.]+ms, node [0-9.]+ms \(unpack [0-9.]+ms, fetch [0-9.]+ms, volumes [0-9.]+ms, identity [0-9.]+ms, start [0-9.]+ms, ready [0-9.]+ms\)$`)
	suspendPhases = regexp.MustCompile(`^SUSPENDED: FULL snapshot \S+ \([0-9]+ bytes\); node capture [0-9.]+ms, log [0-9.]+ms, archive [0-9.]+ms, upload [0-9.]+ms$`)
)

// TestWarmWorkersServeNewActors: a template with warmWorkers: 1 gets a
// free worker warm for it (a sandbox made ahead, with no actor's name),
// and a new actor's first activation through the router restores from
// the golden snapshot into that sandbox, as the actor: its hostname and
// certificate are its own. The control plane then warms the other free
// worker; and a worker one actor left warm serves another actor's first
// activation too, renamed.
func TestWarmWorkersServeNewActors(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	tmpl := c.applyTemplate(counterTemplate(t, "counter", func(s *torporv1.TemplateSpec) { s.WarmWorkers = 1 }))
	n := c.nodes[0]

	// activate sends the actor its first requests through the router and
	// checks it runs as itself, started in a warm sandbox on worker.
	activate := func(actor, worker string) {
		t.Helper()
		c.createActor(actor, "counter")
		if code, _, body := c.routerGet(actor); code != http.StatusOK || body != "count=1 lines=1" {
			t.Fatalf("GET / of %s: %d %q, want count=1 lines=1", actor, code, body)
		}
		if code, _, body := c.routerGetPath(actor, "/hostname"); code != http.StatusOK || body != actor {
			t.Fatalf("hostname of %s: %d %q, want %q", actor, code, body, actor)
		}
		want := "spiffe://torpor.local/space/default/actor/" + actor + " serial="
		if code, _, body := c.routerGetPath(actor, "/whoami"); code != http.StatusOK || !strings.HasPrefix(body, want) {
			t.Fatalf("whoami of %s: %d %q, want %s...", actor, code, body, want)
		}
		a := c.actor(actor)
		if got := a.GetStatus().GetWorker().GetName(); got != worker {
			t.Fatalf("%s runs on %s, want %s, the warm worker", actor, got, worker)
		}
		events := c.events(actor)
		// The reason also says where the time went: the claim, the node
		// call, and the node's steps, the runtime's restore ("start") and
		// the readiness probe ("ready") among them.
		if last := events[len(events)-1].GetReason(); !resumePhases.MatchString(last) || !strings.HasPrefix(last, "resumed (DATA_ON_GOLDEN, into a warm sandbox); ") {
			t.Fatalf("%s's last event: %q, want a resume from the golden snapshot into a warm sandbox, with its phases", actor, last)
		}
	}

	first := c.waitWarmForTemplate(n, tmpl.GetMetadata().GetUid(), "")
	activate("a1", first)
	second := c.waitWarmForTemplate(n, tmpl.GetMetadata().GetUid(), first)
	activate("a2", second)

	// a1's worker, warm for a1 once it is suspended, serves a3's first
	// activation: a3 gets its own name, not a1's.
	c.suspend("a1")
	c.waitFor("a1's worker to be warm again", func() bool { return n.slotWarm(t, first) })
	activate("a3", first)
	if code, _, body := c.routerGet("a2"); code != http.StatusOK || body != "count=2 lines=2" {
		t.Fatalf("GET / of a2: %d %q, want count=2 lines=2", code, body)
	}
}

// waitWarmForTemplate waits until a worker of n other than not is
// recorded warm for template and its sandbox is made, and returns it.
func (c *cluster) waitWarmForTemplate(n *nodeAgent, template, not string) string {
	c.t.Helper()
	var warm string
	c.waitFor("a worker warm for the template", func() bool {
		resp, err := c.workers.ListWorkers(c.ctx, connect.NewRequest(&torporv1.ListRequest{}))
		if err != nil {
			c.t.Fatal(err)
		}
		for _, w := range resp.Msg.GetWorkers() {
			name := w.GetMetadata().GetName()
			if name != not && w.GetStatus().GetWarmTemplateUid() == template && w.GetStatus().GetActor() == nil && n.slotWarm(c.t, name) {
				warm = name
				return true
			}
		}
		return false
	})
	return warm
}

// slotWarm says whether worker's sandbox on n is warm (made, nothing
// running).
func (n *nodeAgent) slotWarm(t testing.TB, worker string) bool {
	t.Helper()
	ctx := context.Background()
	for i := range n.workers {
		if node.WorkerName(n.name, i) != worker {
			continue
		}
		slot, err := n.network.Slot(ctx, worker, i)
		if err != nil {
			t.Fatal(err)
		}
		st, err := n.runtime.Stats(ctx, slot)
		return err == nil && st.Warm
	}
	t.Fatalf("worker %s is not on node %s", worker, n.name)
	return false
}
