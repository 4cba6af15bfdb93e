package dnsproxy

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// BenchmarkResolve: an A query for an allowed name over UDP, straight to
// the upstream and through the resolver (which forwards it, filters the
// answer and permits its address), alternately in one loop so both see
// the same load. Permit does nothing here: the node's (an nftables set
// element per address) is internal/netns's cost. The upstream is this
// process's test server, a fast one; a real resolver's answer takes
// milliseconds, so the resolver's own cost is "added-ns/query" more than
// the ratio.
//
//	go test -run '^$' -bench Resolve -benchtime=5000x ./internal/dnsproxy
func BenchmarkResolve(b *testing.B) {
	up := startUpstream(b)
	addr := startProxy(b, Config{
		Upstreams: []string{up.addr},
		Client: func(netip.Addr) (Client, bool) {
			return Client{Key: "slot-1", Policy: allowlist}, true
		},
		Permit: func(context.Context, Client, int, []netip.Addr, time.Duration) error { return nil },
	})
	q := new(dns.Msg).SetQuestion("a.example.com.", dns.TypeA)
	// One connection each, as a sandbox's stub resolver keeps its socket.
	direct, err := new(dns.Client).Dial(up.addr)
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	proxied, err := new(dns.Client).Dial(addr)
	if err != nil {
		b.Fatal(err)
	}
	defer proxied.Close()
	cl := new(dns.Client)
	ask := func(c *dns.Conn) time.Duration {
		start := time.Now()
		r, _, err := cl.ExchangeWithConn(q, c)
		if err != nil {
			b.Fatal(err)
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			b.Fatalf("answer %v, want a.example.com's address", r)
		}
		return time.Since(start)
	}
	var viaUpstream, viaProxy time.Duration
	n := 0
	for b.Loop() {
		viaUpstream += ask(direct)
		viaProxy += ask(proxied)
		n++
	}
	b.ReportMetric(float64(viaUpstream.Nanoseconds())/float64(n), "upstream-ns/query")
	b.ReportMetric(float64(viaProxy.Nanoseconds())/float64(n), "resolver-ns/query")
	b.ReportMetric(float64(viaProxy-viaUpstream)/float64(n), "added-ns/query")
	b.ReportMetric(float64(viaProxy)/float64(viaUpstream), "resolver/upstream")
}
