package e2e

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/client"
)

// BenchmarkRedisTunnel measures what a TCP tunnel through the router
// costs a real Redis in a running actor, interleaved per iteration:
//
//   - direct: connect to the worker's address from the node's host, PING,
//     close (the baseline: what only the host may still do);
//
//   - tunnel: open a tunnel (the router checks the token with the control
//     plane, finds the actor, connects through the node), PING, close;
//
//   - tunnel-rtt: a PING on a tunnel kept open (relaying only).
//
//     go test -run '^$' -bench RedisTunnel -benchtime=200x ./e2e
func BenchmarkRedisTunnel(b *testing.B) {
	c := newCluster(b, clusterOptions{backend: "sqlite"})
	c.applyTemplate(redisTemplate(buildRedisImage(b, b.TempDir())))
	c.createActor("redis", "redis")
	a := c.mustResume("redis")
	direct := net.JoinHostPort(a.GetStatus().GetWorker().GetIp(), "6379")
	t := client.Tunnel{Router: c.ingress, Token: c.apiToken("default")}
	ping := func(conn net.Conn, r *bufio.Reader) {
		if _, err := conn.Write([]byte("PING\r\n")); err != nil {
			b.Fatal(err)
		}
		if line, err := r.ReadString('\n'); err != nil || line != "+PONG\r\n" {
			b.Fatalf("PING: %q, %v", line, err)
		}
	}
	once := func(dial func() (net.Conn, error)) time.Duration {
		start := time.Now()
		conn, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		ping(conn, bufio.NewReader(conn))
		conn.Close()
		return time.Since(start)
	}
	kept, err := t.Dial(c.ctx, "default", "redis", 6379)
	if err != nil {
		b.Fatal(err)
	}
	defer kept.Close()
	keptR := bufio.NewReader(kept)
	var sums [3]time.Duration
	b.ResetTimer()
	for range b.N {
		sums[0] += once(func() (net.Conn, error) { return net.Dial("tcp", direct) })
		sums[1] += once(func() (net.Conn, error) { return t.Dial(c.ctx, "default", "redis", 6379) })
		start := time.Now()
		ping(kept, keptR)
		sums[2] += time.Since(start)
	}
	b.StopTimer()
	for i, name := range []string{"direct", "tunnel", "tunnel-rtt"} {
		b.ReportMetric(float64(sums[i].Microseconds())/float64(b.N), name+"-us/op")
	}
	b.ReportMetric(float64(sums[1])/float64(sums[0]), "tunnel/direct")
}
