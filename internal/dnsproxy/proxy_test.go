package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"

	"github.com/torpor-dev/torpor/internal/egress"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func host(h string, ports ...uint16) egress.Rule {
	r := egress.Rule{Host: h, Protocol: egress.TCP, Ports: []egress.PortRange{{First: 1, Last: 65535}}}
	if len(ports) > 0 {
		r.Ports = []egress.PortRange{{First: ports[0], Last: ports[0]}}
	}
	return r
}

var allowlist = egress.Policy{Mode: egress.Allowlist, Rules: []egress.Rule{
	host("a.example.com", 443),
	host("*.example.com", 80),
	{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Protocol: egress.TCP, Ports: []egress.PortRange{{First: 1, Last: 65535}}},
	host("www.example.com", 8443),
	host("*.y.example.org", 443),
	host("big.example.com", 443),
	host("zero.example.com", 443),
	host("day.example.com", 443),
	host("inside.example.com", 443),
	host("mixed.example.com", 443),
}}

// recorder keeps what the proxy told the node, in order, with what the
// client received.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func TestQueries(t *testing.T) {
	up := startUpstream(t)
	for _, tc := range []struct {
		name      string
		policy    egress.Policy
		unknown   bool
		permitErr error
		qname     string
		qtype     uint16
		tcp       bool
		rcode     int
		answer    []string // the answer's records, as text
		events    []string // Permit and Refused calls, then "answer"
	}{
		{name: "allowed name, two rules", policy: allowlist, qname: "a.example.com.", qtype: dns.TypeA, rcode: dns.RcodeSuccess,
			answer: []string{"a.example.com.\t300\tIN\tA\t198.51.100.1"},
			events: []string{"permit slot-1 rule 0 [198.51.100.1] 5m0s", "permit slot-1 rule 1 [198.51.100.1] 5m0s", "answer"}},
		{name: "wildcard rule only", policy: allowlist, qname: "api.example.com.", qtype: dns.TypeA, rcode: dns.RcodeSuccess,
			answer: []string{"api.example.com.\t300\tIN\tA\t198.51.100.9"},
			events: []string{"permit slot-1 rule 1 [198.51.100.9] 5m0s", "answer"}},
		{name: "wildcard two labels deep", policy: allowlist, qname: "X.Y.example.org.", qtype: dns.TypeA, rcode: dns.RcodeSuccess,
			answer: []string{"x.y.example.org.\t300\tIN\tA\t198.51.100.8"},
			events: []string{"permit slot-1 rule 4 [198.51.100.8] 5m0s", "answer"}},
		{name: "wildcard does not match its domain", policy: allowlist, qname: "y.example.org.", qtype: dns.TypeA, rcode: dns.RcodeRefused,
			events: []string{"refused slot-1 y.example.org", "answer"}},
		{name: "cname chain, shortest ttl, stray record dropped", policy: allowlist, qname: "www.example.com.", qtype: dns.TypeA, rcode: dns.RcodeSuccess,
			answer: []string{"www.example.com.\t60\tIN\tCNAME\tedge.cdn.net.", "edge.cdn.net.\t60\tIN\tCNAME\te1.cdn.net.", "e1.cdn.net.\t60\tIN\tA\t203.0.113.7"},
			events: []string{"permit slot-1 rule 1 [203.0.113.7] 1m0s", "permit slot-1 rule 3 [203.0.113.7] 1m0s", "answer"}},
		{name: "not allowed name", policy: allowlist, qname: "blocked.example.net.", qtype: dns.TypeA, rcode: dns.RcodeRefused,
			events: []string{"refused slot-1 blocked.example.net", "answer"}},
		{name: "address rule does not allow a name", policy: allowlist, qname: "blocked.example.net.", qtype: dns.TypeMX, rcode: dns.RcodeRefused,
			events: []string{"refused slot-1 blocked.example.net", "answer"}},
		{name: "escaped dot is no subdomain", policy: allowlist, qname: `evil\.example.com.`, qtype: dns.TypeA, rcode: dns.RcodeRefused,
			events: []string{`refused slot-1 evil\.example.com`, "answer"}},
		{name: "deny", policy: egress.Policy{Mode: egress.Deny}, qname: "a.example.com.", qtype: dns.TypeA, rcode: dns.RcodeRefused,
			events: []string{"refused slot-1 a.example.com", "answer"}},
		{name: "no policy is deny", qname: "a.example.com.", qtype: dns.TypeA, rcode: dns.RcodeRefused,
			events: []string{"refused slot-1 a.example.com", "answer"}},
		{name: "allow: any name, no permit", policy: egress.Policy{Mode: egress.Allow}, qname: "blocked.example.net.", qtype: dns.TypeA, rcode: dns.RcodeSuccess,
			answer: []string{"blocked.example.net.\t300\tIN\tA\t198.51.100.6"}, events: []string{"answer"}},
		{name: "allow: protected answers dropped", policy: egress.Policy{Mode: egress.Allow}, qname: "inside.example.com.", qtype: dns.TypeA, rcode: dns.RcodeRefused,
			events: []string{"refused slot-1 inside.example.com", "answer"}},
		{name: "aaaa emptied", policy: allowlist, qname: "a.example.com.", qtype: dns.TypeAAAA, rcode: dns.RcodeSuccess, events: []string{"answer"}},
		{name: "mx forwarded, nothing permitted", policy: allowlist, qname: "a.example.com.", qtype: dns.TypeMX, rcode: dns.RcodeSuccess,
			answer: []string{"a.example.com.\t300\tIN\tMX\t10 mail.example.com."}, events: []string{"answer"}},
		{name: "any refused", policy: allowlist, qname: "a.example.com.", qtype: dns.TypeANY, rcode: dns.RcodeRefused, events: []string{"answer"}},
		{name: "only protected answers", policy: allowlist, qname: "inside.example.com.", qtype: dns.TypeA, rcode: dns.RcodeRefused,
			events: []string{"refused slot-1 inside.example.com", "answer"}},
		{name: "public and protected answers", policy: allowlist, qname: "mixed.example.com.", qtype: dns.TypeA, rcode: dns.RcodeSuccess,
			answer: []string{"mixed.example.com.\t300\tIN\tA\t198.51.100.2"},
			events: []string{"permit slot-1 rule 1 [198.51.100.2] 5m0s", "permit slot-1 rule 9 [198.51.100.2] 5m0s", "answer"}},
		{name: "ttl 0 permitted 5s", policy: allowlist, qname: "zero.example.com.", qtype: dns.TypeA, rcode: dns.RcodeSuccess,
			answer: []string{"zero.example.com.\t0\tIN\tA\t198.51.100.4"},
			events: []string{"permit slot-1 rule 1 [198.51.100.4] 5s", "permit slot-1 rule 6 [198.51.100.4] 5s", "answer"}},
		{name: "ttl 86400 permitted and answered 1h", policy: allowlist, qname: "day.example.com.", qtype: dns.TypeA, rcode: dns.RcodeSuccess,
			answer: []string{"day.example.com.\t3600\tIN\tA\t198.51.100.5"},
			events: []string{"permit slot-1 rule 1 [198.51.100.5] 1h0m0s", "permit slot-1 rule 7 [198.51.100.5] 1h0m0s", "answer"}},
		{name: "truncated upstream answer retried over tcp", policy: allowlist, qname: "big.example.com.", qtype: dns.TypeA, rcode: dns.RcodeSuccess,
			answer: []string{"big.example.com.\t300\tIN\tA\t198.51.100.3"},
			events: []string{"permit slot-1 rule 1 [198.51.100.3] 5m0s", "permit slot-1 rule 5 [198.51.100.3] 5m0s", "answer"}},
		{name: "over tcp", policy: allowlist, tcp: true, qname: "a.example.com.", qtype: dns.TypeA, rcode: dns.RcodeSuccess,
			answer: []string{"a.example.com.\t300\tIN\tA\t198.51.100.1"},
			events: []string{"permit slot-1 rule 0 [198.51.100.1] 5m0s", "permit slot-1 rule 1 [198.51.100.1] 5m0s", "answer"}},
		{name: "nxdomain passed with its soa", policy: allowlist, qname: "nope.example.com.", qtype: dns.TypeA, rcode: dns.RcodeNameError, events: []string{"answer"}},
		{name: "unknown client", unknown: true, policy: allowlist, qname: "a.example.com.", qtype: dns.TypeA, rcode: dns.RcodeRefused, events: []string{"answer"}},
		{name: "permit error", policy: allowlist, permitErr: errors.New("nft: no"), qname: "a.example.com.", qtype: dns.TypeA, rcode: dns.RcodeServerFailure,
			events: []string{"permit slot-1 rule 0 [198.51.100.1] 5m0s", "answer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			addr := startProxy(t, Config{
				Upstreams: []string{silent(t), up.addr},
				Timeout:   200 * time.Millisecond,
				Client: func(src netip.Addr) (Client, bool) {
					if tc.unknown || src != netip.MustParseAddr("127.0.0.1") {
						return Client{}, false
					}
					return Client{Key: "slot-1", Policy: tc.policy}, true
				},
				Permit: func(_ context.Context, c Client, rule int, addrs []netip.Addr, ttl time.Duration) error {
					rec.add("permit %s rule %d %v %v", c.Key, rule, addrs, ttl)
					return tc.permitErr
				},
				Refused: func(c Client, name string) { rec.add("refused %s %s", c.Key, name) },
			})
			tcpBefore := up.tcpQueries()
			m := new(dns.Msg).SetQuestion(tc.qname, tc.qtype)
			cl := &dns.Client{Net: "udp"}
			if tc.tcp {
				cl.Net = "tcp"
			}
			r, _, err := cl.Exchange(m, addr)
			if err != nil {
				t.Fatal(err)
			}
			rec.add("answer")
			if r.Rcode != tc.rcode {
				t.Errorf("rcode %s, want %s", dns.RcodeToString[r.Rcode], dns.RcodeToString[tc.rcode])
			}
			var got []string
			for _, rr := range r.Answer {
				got = append(got, rr.String())
			}
			if !slices.Equal(got, tc.answer) {
				t.Errorf("answer\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.answer, "\n"))
			}
			if len(r.Extra) > 0 {
				t.Errorf("additional section forwarded: %v", r.Extra)
			}
			if tc.rcode == dns.RcodeNameError && len(r.Ns) != 1 {
				t.Errorf("authority %v, want the SOA", r.Ns)
			}
			if ev := rec.list(); !slices.Equal(ev, tc.events) {
				t.Errorf("events\n%s\nwant\n%s", strings.Join(ev, "\n"), strings.Join(tc.events, "\n"))
			}
			if tc.qname == "big.example.com." && up.tcpQueries() == tcpBefore {
				t.Errorf("the truncated answer was not asked again over TCP")
			}
		})
	}
}

// Another client asking the same name goes through its own policy: an
// answer permitted for one is never permitted for the other.
func TestNoSharingBetweenClients(t *testing.T) {
	up := startUpstream(t)
	rec := &recorder{}
	// Both clients are on 127.0.0.1 here: the proxy is told who asks by
	// the test, one query each.
	var mu sync.Mutex
	current := Client{Key: "slot-1", Policy: allowlist}
	addr := startProxy(t, Config{
		Upstreams: []string{up.addr},
		Client: func(netip.Addr) (Client, bool) {
			mu.Lock()
			defer mu.Unlock()
			return current, true
		},
		Permit: func(_ context.Context, c Client, rule int, addrs []netip.Addr, ttl time.Duration) error {
			rec.add("permit %s rule %d %v", c.Key, rule, addrs)
			return nil
		},
		Refused: func(c Client, name string) { rec.add("refused %s %s", c.Key, name) },
	})
	ask := func() {
		if _, _, err := new(dns.Client).Exchange(new(dns.Msg).SetQuestion("api.example.com.", dns.TypeA), addr); err != nil {
			t.Fatal(err)
		}
	}
	ask()
	mu.Lock()
	current = Client{Key: "slot-2", Policy: egress.Policy{Mode: egress.Allowlist, Rules: []egress.Rule{host("other.example.com", 443)}}}
	mu.Unlock()
	ask()
	want := []string{"permit slot-1 rule 1 [198.51.100.9]", "refused slot-2 api.example.com"}
	if ev := rec.list(); !slices.Equal(ev, want) {
		t.Errorf("events %q, want %q", ev, want)
	}
}

// Malformed queries: several questions, and a name over 253 bytes.
func TestFormErr(t *testing.T) {
	up := startUpstream(t)
	addr := startProxy(t, Config{
		Upstreams: []string{up.addr},
		Client: func(netip.Addr) (Client, bool) {
			return Client{Key: "slot-1", Policy: egress.Policy{Mode: egress.Allow}}, true
		},
		Permit: func(context.Context, Client, int, []netip.Addr, time.Duration) error { return nil },
	})
	two := new(dns.Msg).SetQuestion("a.example.com.", dns.TypeA)
	two.Question = append(two.Question, dns.Question{Name: "b.example.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	long := new(dns.Msg).SetQuestion("a.example.com.", dns.TypeA)
	wire, err := long.Pack()
	if err != nil {
		t.Fatal(err)
	}
	// Replace the question by one of 5 labels of 63 bytes: 320 bytes.
	var name []byte
	for range 5 {
		name = append(name, 63)
		name = append(name, strings.Repeat("a", 63)...)
	}
	name = append(name, 0)
	longWire := append(append(slices.Clone(wire[:12]), name...), 0, 1, 0, 1)
	twoWire, err := two.Pack()
	if err != nil {
		t.Fatal(err)
	}
	for label, q := range map[string][]byte{"two questions": twoWire, "long name": longWire} {
		t.Run(label, func(t *testing.T) {
			c, err := net.Dial("udp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(q); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 512)
			if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			n, err := c.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			r := new(dns.Msg)
			if err := r.Unpack(buf[:n]); err != nil && !strings.Contains(err.Error(), "") {
				t.Fatal(err)
			}
			if r.Rcode != dns.RcodeFormatError {
				t.Errorf("rcode %s, want FORMERR", dns.RcodeToString[r.Rcode])
			}
		})
	}
}
