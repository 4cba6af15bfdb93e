package netnstest

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// DNS serves the test internet's names: an A query for a name of answers
// gets its addresses (TTL 60 s), any other query an empty answer, and a
// name not in answers NXDOMAIN. It listens on 127.0.0.1, UDP and TCP on one
// port, until tb ends, and returns that address (a node's upstream).
func DNS(tb testing.TB, answers map[string][]netip.Addr) string {
	tb.Helper()
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		out := new(dns.Msg)
		out.SetReply(req)
		for _, q := range req.Question {
			addrs, ok := answers[strings.ToLower(strings.TrimSuffix(q.Name, "."))]
			if !ok {
				out.Rcode = dns.RcodeNameError
				continue
			}
			if q.Qtype != dns.TypeA {
				continue
			}
			for _, a := range addrs {
				out.Answer = append(out.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: a.AsSlice()})
			}
		}
		w.WriteMsg(out) //nolint:errcheck // the resolver retries
	})
	tcp, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	udp, err := net.ListenPacket("udp4", tcp.Addr().String())
	if err != nil {
		tcp.Close()
		tb.Fatal(err)
	}
	for _, srv := range []*dns.Server{{PacketConn: udp, Handler: handler}, {Listener: tcp, Handler: handler}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe() //nolint:errcheck // ends with Shutdown
		<-started
		tb.Cleanup(func() { srv.Shutdown() }) //nolint:errcheck // best effort
	}
	return tcp.Addr().String()
}
