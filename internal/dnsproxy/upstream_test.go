package dnsproxy

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

// zone is the test upstream's fixed answers, by name and type.
var zone = map[string][]string{
	"a.example.com. A":       {"a.example.com. 300 IN A 198.51.100.1"},
	"a.example.com. AAAA":    {"a.example.com. 300 IN AAAA 2001:db8::1"},
	"a.example.com. MX":      {"a.example.com. 300 IN MX 10 mail.example.com."},
	"api.example.com. A":     {"api.example.com. 300 IN A 198.51.100.9"},
	"x.y.example.org. A":     {"x.y.example.org. 300 IN A 198.51.100.8"},
	"www.example.com. A":     {"www.example.com. 600 IN CNAME edge.cdn.net.", "edge.cdn.net. 120 IN CNAME e1.cdn.net.", "e1.cdn.net. 60 IN A 203.0.113.7", "other.net. 60 IN A 203.0.113.99"},
	"inside.example.com. A":  {"inside.example.com. 300 IN A 10.0.0.5", "inside.example.com. 300 IN A 169.254.169.254"},
	"mixed.example.com. A":   {"mixed.example.com. 300 IN A 198.51.100.2", "mixed.example.com. 300 IN A 127.0.0.1"},
	"big.example.com. A":     {"big.example.com. 300 IN A 198.51.100.3"},
	"zero.example.com. A":    {"zero.example.com. 0 IN A 198.51.100.4"},
	"day.example.com. A":     {"day.example.com. 86400 IN A 198.51.100.5"},
	"blocked.example.net. A": {"blocked.example.net. 300 IN A 198.51.100.6"},
}

// upstream is a real DNS server on 127.0.0.1 answering zone; big.example.com
// is truncated over UDP, so only a TCP retry gets its address.
type upstream struct {
	addr string
	mu   sync.Mutex
	tcp  int // queries over TCP
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: pc.LocalAddr().String()}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		q := req.Question[0]
		out := new(dns.Msg).SetReply(req)
		_, overTCP := w.RemoteAddr().(*net.TCPAddr)
		if overTCP {
			u.mu.Lock()
			u.tcp++
			u.mu.Unlock()
		}
		if q.Name == "big.example.com." && !overTCP {
			out.Truncated = true
			_ = w.WriteMsg(out)
			return
		}
		rrs, ok := zone[strings.ToLower(q.Name)+" "+dns.TypeToString[q.Qtype]]
		if !ok {
			out.Rcode = dns.RcodeNameError
			soa, _ := dns.NewRR("example.com. 60 IN SOA ns.example.com. admin.example.com. 1 60 60 60 60")
			out.Ns = []dns.RR{soa}
		}
		for _, s := range rrs {
			rr, err := dns.NewRR(s)
			if err != nil {
				panic(err)
			}
			out.Answer = append(out.Answer, rr)
		}
		glue, _ := dns.NewRR("glue.example.com. 300 IN A 198.51.100.200")
		out.Extra = append(out.Extra, glue)
		_ = w.WriteMsg(out)
	})
	var wg sync.WaitGroup
	// Registered before the shutdowns, so it runs after them (cleanups
	// run last first).
	t.Cleanup(wg.Wait)
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		wg.Go(func() { _ = srv.ActivateAndServe() })
		<-started
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return u
}

func (u *upstream) tcpQueries() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.tcp
}

// silent is an upstream that reads and never answers.
func silent(t testing.TB) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	return pc.LocalAddr().String()
}

// startProxy runs a proxy on 127.0.0.1 until the test ends, and checks
// that Serve returned.
func startProxy(t testing.TB, cfg Config) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := New(cfg)
	var wg sync.WaitGroup
	wg.Go(func() { done <- s.Serve(ctx, pc, ln) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return pc.LocalAddr().String()
}
