package dnsproxy

import (
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/torpor-dev/torpor/internal/egress"
)

// maxChain bounds the CNAME chain followed in an answer.
const maxChain = 16

// filter returns what of up's answer and authority sections reaches the
// client: the CNAME chain from q's name; for A, the chain's A records with
// a public address; for another type (not AAAA), the chain's records of
// that type; and of the authority section only the SOA.
func filter(q dns.Question, up *dns.Msg) (answer, ns []dns.RR) {
	names := map[string]bool{strings.ToLower(q.Name): true}
	for range maxChain {
		grown := false
		for _, rr := range up.Answer {
			if c, ok := rr.(*dns.CNAME); ok && names[strings.ToLower(c.Hdr.Name)] && !names[strings.ToLower(c.Target)] {
				names[strings.ToLower(c.Target)] = true
				grown = true
			}
		}
		if !grown {
			break
		}
	}
	for _, rr := range up.Answer {
		h := rr.Header()
		if !names[strings.ToLower(h.Name)] {
			continue
		}
		switch rr := rr.(type) {
		case *dns.CNAME:
			answer = append(answer, rr)
		case *dns.A:
			if a, ok := netip.AddrFromSlice(rr.A); ok && q.Qtype == dns.TypeA && egress.Public(a) {
				answer = append(answer, rr)
			}
		case *dns.AAAA:
		default:
			if h.Rrtype == q.Qtype {
				answer = append(answer, rr)
			}
		}
	}
	for _, rr := range up.Ns {
		if _, ok := rr.(*dns.SOA); ok {
			ns = append(ns, rr)
		}
	}
	return answer, ns
}

// addresses returns the A records' addresses and the shortest TTL of the
// answer (its CNAMEs included: the answer holds no longer than its
// weakest link).
func addresses(answer []dns.RR) ([]netip.Addr, time.Duration) {
	var addrs []netip.Addr
	ttl := MaxTTL
	for _, rr := range answer {
		ttl = min(ttl, time.Duration(rr.Header().Ttl)*time.Second)
		if a, ok := rr.(*dns.A); ok {
			if addr, ok := netip.AddrFromSlice(a.A); ok {
				addrs = append(addrs, addr.Unmap())
			}
		}
	}
	return addrs, ttl
}

func hasA(rrs []dns.RR) bool {
	for _, rr := range rrs {
		if _, ok := rr.(*dns.A); ok {
			return true
		}
	}
	return false
}
