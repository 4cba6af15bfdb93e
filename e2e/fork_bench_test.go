package e2e

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/latency"
)

// BenchmarkFork measures forks on real gVisor, each iteration interleaving
// the operations with their baseline:
//
//   - fork-running: CreateActor --from a RUNNING counter until the answer
//     (the source suspended, the fork's records written, the source
//     resumed); baseline suspend-resume: SuspendActor then ResumeActor of
//     the same counter, the two steps the fork adds.
//   - fork-first-request: the fork's first request through the router
//     (its restore from the source's snapshot files); baseline
//     activation: the source's first request after a suspend (its
//     restore from its own snapshot).
//
// Forks are deleted, untimed, after each iteration.
//
//	go test -run '^$' -bench Fork -benchtime=20x ./e2e
func BenchmarkFork(b *testing.B) {
	c := newCluster(b, clusterOptions{backend: "sqlite", workersPerNode: 3})
	c.applyTemplate(counterTemplate(b, "counter", nil))
	c.createActor("src", "counter")
	count := 0
	request := func(actor string, want int) time.Duration {
		b.Helper()
		start := time.Now()
		code, _, body := c.routerGetPath(actor, "/")
		took := time.Since(start)
		if code != 200 || body != fmt.Sprintf("count=%d lines=%d", want, want) {
			b.Fatalf("GET / of %s: %d %q, want count=%d", actor, code, body, want)
		}
		return took
	}
	count++
	request("src", count)

	var fork, cycle, forkFirst, activation latency.Samples
	for i := range b.N {
		name := fmt.Sprintf("f%d", i)
		start := time.Now()
		if _, err := c.actors.CreateActor(c.ctx, connect.NewRequest(&torporv1.CreateActorRequest{
			Actor: &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "default", Name: name}},
			From:  &torporv1.ForkSource{Actor: "src"},
		})); err != nil {
			b.Fatal(err)
		}
		fork.Add(time.Since(start))
		forkFirst.Add(request(name, count+1))

		start = time.Now()
		c.suspend("src")
		c.mustResume("src")
		cycle.Add(time.Since(start))
		c.suspend("src")
		count++
		activation.Add(request("src", count))

		b.StopTimer()
		c.suspend(name)
		if _, err := c.actors.DeleteActor(c.ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: "default", Name: name})); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	fork.Report(b, "fork-running", 0.50, 0.95)
	cycle.Report(b, "suspend-resume", 0.50, 0.95)
	forkFirst.Report(b, "fork-first-request", 0.50, 0.95)
	activation.Report(b, "activation", 0.50, 0.95)
	b.ReportMetric(fork.Millis(0.50)/cycle.Millis(0.50), "fork/cycle-p50")
	b.ReportMetric(forkFirst.Millis(0.50)/activation.Millis(0.50), "first/activation-p50")
}
