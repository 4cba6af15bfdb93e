package e2e

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// TestLifecycle is the lifecycle's acceptance on real gVisor, once per
// store backend: golden, resume, suspend, resume elsewhere, pause.
func TestLifecycle(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			c := newCluster(t, clusterOptions{backend: backend, workersPerNode: 2})
			c.applyTemplate(counterTemplate(t, "counter", nil))
			c.createActor("c1", "counter")

			first := c.mustResume("c1")
			if r := c.events("c1")[0].GetReason(); !strings.Contains(r, "DATA_ON_GOLDEN") {
				t.Fatalf("a new actor's first resume should restore the golden: %q", r)
			}
			for i := 1; i <= 3; i++ {
				if got, want := get(t, first), fmt.Sprintf("count=%d lines=%d", i, i); got != want {
					t.Fatalf("request %d: %q, want %q", i, got, want)
				}
			}

			s := c.suspend("c1")
			if s.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED || s.GetStatus().GetWorker() != nil {
				t.Fatalf("after suspend: %v", s.GetStatus())
			}
			// The suspend's event says where the node's time went.
			events := c.events("c1")
			if r := events[len(events)-1].GetReason(); !suspendPhases.MatchString(r) {
				t.Errorf("the suspend's event %q does not match %s", r, suspendPhases)
			}
			w, err := c.workers.GetWorker(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: first.GetStatus().GetWorker().GetNamespace(), Name: first.GetStatus().GetWorker().GetName()}))
			if err != nil {
				t.Fatal(err)
			}
			if w.Msg.GetStatus().GetActor() != nil {
				t.Fatalf("the suspended actor's worker is still held: %v", w.Msg.GetStatus())
			}
			// An emptied worker refuses connections at once, so a router
			// holding its old address re-resolves instead of waiting.
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(w.Msg.GetSpec().GetIp(), "8080"), 2*time.Second)
			if err == nil {
				conn.Close()
			}
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("dial to the emptied worker: %v, want connection refused", err)
			}

			// Another actor takes the freed worker, so c1 resumes on the other.
			c.createActor("blocker", "counter")
			c.mustResume("blocker")
			moved := c.mustResume("c1")
			if moved.GetStatus().GetWorker().GetName() == first.GetStatus().GetWorker().GetName() {
				t.Fatalf("c1 resumed on the same worker %s", moved.GetStatus().GetWorker().GetName())
			}
			if got := get(t, moved); got != "count=4 lines=4" {
				t.Fatalf("after suspend and resume on another worker: %q, want count=4 lines=4", got)
			}

			c.pause("c1")
			back := c.mustResume("c1")
			if back.GetStatus().GetWorker().GetNode() != moved.GetStatus().GetWorker().GetNode() {
				t.Fatal("a paused actor resumed on another node")
			}
			events = c.events("c1")
			if r := events[len(events)-2].GetReason(); !strings.Contains(r, "FULL from local checkpoint") {
				t.Fatalf("resume after pause: %q, want FULL from the local checkpoint", r)
			}
			if got := get(t, back); got != "count=5 lines=5" {
				t.Fatalf("after pause and resume: %q, want count=5 lines=5", got)
			}
		})
	}
}
