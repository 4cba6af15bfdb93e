package e2e

import (
	"bufio"
	"fmt"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/client"
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
	frozen, awake, paused := ladderRungs(b, c, "bench", request)
	b.ReportMetric(frozen.Millis(0.95)/awake.Millis(0.95), "frozen/awake-p95")
	b.ReportMetric(frozen.Millis(0.95)/paused.Millis(0.95), "frozen/paused-p95")
}

// ladderRungs times request, b.N times each and interleaved, on actor
// frozen, right after (awake) and after a pause, and reports the three's
// p50 and p95. Waiting for the freeze and the pause is not timed.
func ladderRungs(b *testing.B, c *cluster, actor string, request func() time.Duration) (frozen, awake, paused latency.Samples) {
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		c.waitFor("the actor frozen", func() bool { return c.actor(actor).GetStatus().GetFrozenTime() != nil })
		b.StartTimer()
		frozen.Add(request())
		awake.Add(request())
		b.StopTimer()
		c.pause(actor)
		b.StartTimer()
		paused.Add(request())
	}
	b.StopTimer()
	frozen.Report(b, "frozen", 0.50, 0.95)
	awake.Report(b, "awake", 0.50, 0.95)
	paused.Report(b, "paused", 0.50, 0.95)
	return frozen, awake, paused
}

// BenchmarkBigRedisFrozen is BenchmarkFrozenWake for issue 30's big
// actor, a Redis holding ~230 MB (freezeSeconds 1), whose clients come
// through TCP tunnels: a new tunnel and a PING, interleaved per
// iteration once the actor is frozen, right after (awake), and after a
// pause (a restore of the 230 MB on the node). Its keys are checked
// after the run.
//
//	go test -run '^$' -bench BigRedisFrozen -benchtime=5x ./e2e
func BenchmarkBigRedisFrozen(b *testing.B) {
	c := newCluster(b, clusterOptions{backend: "sqlite", workersPerNode: 2})
	tmpl := redisTemplate(buildRedisImage(b, b.TempDir()))
	tmpl.Spec.IdlePolicy = &torporv1.IdlePolicy{FreezeSeconds: 1}
	c.applyTemplate(tmpl)
	c.createActor("big", "redis")
	t := client.Tunnel{Router: c.ingress, Token: c.apiToken("default")}
	ping := func() time.Duration {
		start := time.Now()
		conn, err := t.Dial(c.ctx, "default", "big", 6379)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("PING\r\n")); err != nil {
			b.Fatal(err)
		}
		if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || line != "+PONG\r\n" {
			b.Fatalf("PING: %q, %v", line, err)
		}
		return time.Since(start)
	}
	// The fill and the check go to the worker's address, which the slot
	// gate does not see: a tunnel with a request unanswered keeps the
	// actor awake meanwhile.
	awake := func(work func(ip string)) {
		conn, err := t.Dial(c.ctx, "default", "big", 6379)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("BLPOP torpor:awake 0\r\n")); err != nil {
			b.Fatal(err)
		}
		ip := c.actor("big").GetStatus().GetWorker().GetIp()
		work(ip)
		r, err := dialRedis(ip)
		if err != nil {
			b.Fatal(err)
		}
		defer r.conn.Close()
		if _, err := r.do("RPUSH", "torpor:awake", "done"); err != nil {
			b.Fatal(err)
		}
		if _, err := bufio.NewReader(conn).ReadString('\n'); err != nil {
			b.Fatal(err)
		}
	}
	c.mustResume("big")
	awake(func(ip string) { fillRedis(b, ip) })
	frozen, _, paused := ladderRungs(b, c, "big", ping)
	awake(func(ip string) { checkRedis(b, ip) })
	b.ReportMetric(frozen.Millis(0.50)/paused.Millis(0.50), "frozen/paused-p50")
}
