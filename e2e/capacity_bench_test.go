package e2e

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/latency"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// BenchmarkActivationWithEviction measures what an eviction costs an
// activation on real gVisor: a request through the router for the
// suspended counter actor "bench" until its answer is read, on a node of 2
// workers, one held by an actor never evicted. Each iteration runs,
// interleaved:
//
//   - free: the other worker is free (and kept warm for bench, as after
//     any suspend): the resume restores into it.
//
//   - eviction (sub-benchmark no-headroom): another counter actor took
//     that worker and has been idle for the eviction minimum (waited for,
//     untimed): the resume finds no free worker, suspends it, and restores
//     bench into the worker it freed.
//
//   - eviction (sub-benchmark headroom-1): the same with the pool's
//     headroom at 1: the control plane's sweep suspends the other actor
//     once it is evictable (waited for, untimed), and the resume finds a
//     free worker, kept warm for that actor, not for bench.
//
//     go test -run '^$' -bench ActivationWithEviction -benchtime=20x ./e2e
func BenchmarkActivationWithEviction(b *testing.B) {
	b.Run("no-headroom", func(b *testing.B) { benchEviction(b, 0) })
	b.Run("headroom-1", func(b *testing.B) { benchEviction(b, 1) })
}

func benchEviction(b *testing.B, headroom int) {
	c := newCluster(b, clusterOptions{backend: "sqlite", workersPerNode: 2, headroom: map[string]int{"default": headroom}})
	c.applyTemplate(counterTemplate(b, "counter", nil))
	c.applyTemplate(counterTemplate(b, "pinned", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{Eviction: &torporv1.EvictionPolicy{Never: true}}
	}))
	c.createActor("holder", "pinned")
	c.createActor("victim", "counter")
	c.createActor("bench", "counter")
	c.mustResume("holder")
	home, client := routedHome(b, c, "bench")
	requests := 1
	fetch(b, client, home)
	n := c.nodes[0]

	var free, evicting, evictWait latency.Samples
	activate := func(b *testing.B, evict bool) time.Duration {
		b.StopTimer()
		if _, err := c.actors.SuspendActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "bench"})); err != nil {
			b.Fatal(err)
		}
		n.waitWarm(b)
		if evict {
			c.mustResume("victim")
			if headroom > 0 {
				c.waitFor("the headroom to suspend the victim", func() bool {
					return c.actor("victim").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_SUSPENDED
				})
				// Headroom frees the worker ahead of demand, and the
				// node warms it then, as after the suspend above.
				n.waitWarm(b)
			} else {
				time.Sleep(workflow.DefaultMinIdleSeconds*time.Second + 100*time.Millisecond)
			}
		}
		b.StartTimer()
		took, body := fetch(b, client, home)
		requests++
		if want := fmt.Sprintf("count=%d lines=%d", requests, requests); body != want {
			b.Fatalf("request %d: %q, want %q", requests, body, want)
		}
		if st := c.actor("victim").GetStatus().GetState(); evict && st != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
			b.Fatalf("the victim is %v after the eviction, want SUSPENDED", st)
		}
		return took
	}
	for range b.N {
		free.Add(activate(b, false))
		evicting.Add(activate(b, true))
		evictWait.Add(lastStep(b, c, "victim", torporv1.ActorState_ACTOR_STATE_SUSPENDED))
	}
	free.Report(b, "free", 0.50, 0.95)
	evicting.Report(b, "eviction", 0.50, 0.95)
	evictWait.Report(b, "victim-suspend", 0.50, 0.95)
	b.ReportMetric(evicting.Millis(0.50)/free.Millis(0.50), "evict/free-p50")
	b.ReportMetric(evicting.Millis(0.95)/free.Millis(0.95), "evict/free-p95")
}

// lastStep is how long the actor's last step into state took, in the
// control plane's record.
func lastStep(b *testing.B, c *cluster, actor string, state torporv1.ActorState) time.Duration {
	b.StopTimer()
	defer b.StartTimer()
	events := c.events(actor)
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].GetToState() == state {
			return time.Duration(events[i].GetDurationMs()) * time.Millisecond
		}
	}
	b.Fatalf("actor %s never became %v", actor, state)
	return 0
}
