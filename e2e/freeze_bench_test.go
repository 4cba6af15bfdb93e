package e2e

import (
	"fmt"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/latency"
)

// BenchmarkFrozenWake: the idle ladder's rungs as a request through the
// router meets them, on real gVisor, interleaved in each iteration on
// one counter actor (freezeSeconds 1):
//
//   - frozen: the first request after the actor was frozen (the slot gate
//     thaws it before the request's bytes pass);
//   - awake: the request right after, the actor running (the baseline);
//   - paused: the first request after a pause (the next rung: a restore
//     from the checkpoint on the node).
//
// Waiting for the freeze and the pause is not timed.
//
//	go test -run '^$' -bench FrozenWake -benchtime=20x ./e2e
func BenchmarkFrozenWake(b *testing.B) {
	c := newCluster(b, clusterOptions{backend: "sqlite", workersPerNode: 2})
	c.applyTemplate(counterTemplate(b, "frozen", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{FreezeSeconds: 1}
	}))
	c.createActor("bench", "frozen")
	home, client := routedHome(b, c, "bench")
	requests := 1
	fetch(b, client, home)
	request := func() time.Duration {
		took, body := fetch(b, client, home)
		requests++
		if want := fmt.Sprintf("count=%d lines=%d", requests, requests); body != want {
			b.Fatalf("request %d: %q, want %q", requests, body, want)
		}
		return took
	}
	var frozen, awake, paused latency.Samples
	for range b.N {
		b.StopTimer()
		c.waitFor("the actor frozen", func() bool { return c.actor("bench").GetStatus().GetFrozenTime() != nil })
		b.StartTimer()
		frozen.Add(request())
		awake.Add(request())
		b.StopTimer()
		c.pause("bench")
		b.StartTimer()
		paused.Add(request())
	}
	frozen.Report(b, "frozen", 0.50, 0.95)
	awake.Report(b, "awake", 0.50, 0.95)
	paused.Report(b, "paused", 0.50, 0.95)
	b.ReportMetric(frozen.Millis(0.95)/awake.Millis(0.95), "frozen/awake-p95")
	b.ReportMetric(frozen.Millis(0.95)/paused.Millis(0.95), "frozen/paused-p95")
}
