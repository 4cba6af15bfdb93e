package dnsproxy

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/torpor-dev/torpor/internal/egress"
)

// maxName is the longest name, in bytes without the root's dot.
const maxName = 253

func (s *Server) serveDNS(ctx context.Context, w dns.ResponseWriter, req *dns.Msg) {
	select {
	case s.inflight <- struct{}{}:
		defer func() { <-s.inflight }()
	default:
		s.reply(w, req, rcode(req, dns.RcodeRefused))
		return
	}
	s.reply(w, req, s.answer(ctx, w.RemoteAddr(), req))
}

// reply writes out, truncated to what the client can take over UDP.
func (s *Server) reply(w dns.ResponseWriter, req, out *dns.Msg) {
	if opt := req.IsEdns0(); opt != nil {
		out.SetEdns0(upstreamUDPSize, false)
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(size, int(opt.UDPSize()))
		}
		out.Truncate(size)
	}
	if err := w.WriteMsg(out); err != nil {
		s.log.Debug("writing a dns answer", "remote", w.RemoteAddr(), "error", err)
	}
}

func rcode(req *dns.Msg, code int) *dns.Msg {
	out := new(dns.Msg).SetRcode(req, code)
	out.RecursionAvailable = true
	return out
}

func source(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap.Addr().Unmap()
}

// answer decides and builds the answer to req (see the package doc).
func (s *Server) answer(ctx context.Context, remote net.Addr, req *dns.Msg) *dns.Msg {
	c, ok := s.cfg.Client(source(remote))
	if !ok {
		s.log.Debug("dns query from an unknown source", "remote", remote)
		return rcode(req, dns.RcodeRefused)
	}
	if req.Opcode != dns.OpcodeQuery {
		return rcode(req, dns.RcodeNotImplemented)
	}
	if len(req.Question) != 1 {
		return rcode(req, dns.RcodeFormatError)
	}
	q := req.Question[0]
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	if len(name) > maxName {
		return rcode(req, dns.RcodeFormatError)
	}
	switch q.Qtype {
	case dns.TypeANY, dns.TypeAXFR, dns.TypeIXFR, dns.TypeMAILA, dns.TypeMAILB:
		return rcode(req, dns.RcodeRefused)
	}
	if q.Qclass != dns.ClassINET {
		return rcode(req, dns.RcodeRefused)
	}
	rules, allowed := matching(c.Policy, name)
	if !allowed {
		s.cfg.Refused(c, name)
		return rcode(req, dns.RcodeRefused)
	}
	up, err := s.forward(ctx, q)
	if err != nil {
		s.log.Warn("dns query not answered upstream", "client", c.Key, "name", name, "error", err)
		return rcode(req, dns.RcodeServerFailure)
	}
	out := rcode(req, up.Rcode)
	out.Answer, out.Ns = filter(q, up)
	if q.Qtype != dns.TypeA {
		return out
	}
	addrs, ttl := addresses(out.Answer)
	if len(addrs) == 0 && hasA(up.Answer) {
		// Every address was protected: the name is not made reachable.
		s.cfg.Refused(c, name)
		return rcode(req, dns.RcodeRefused)
	}
	if len(addrs) == 0 {
		return out // no such name, or no address: nothing to permit
	}
	ttl = min(max(ttl, MinTTL), MaxTTL)
	for _, rr := range out.Answer {
		rr.Header().Ttl = min(rr.Header().Ttl, uint32(ttl/time.Second))
	}
	for _, rule := range rules {
		if err := s.cfg.Permit(ctx, c, rule, addrs, ttl); err != nil {
			s.log.Warn("dns answer not permitted", "client", c.Key, "name", name, "rule", rule, "error", err)
			return rcode(req, dns.RcodeServerFailure)
		}
	}
	return out
}

// matching returns the indexes of the host rules of p that match name,
// and whether p allows name at all (Allow: every name, no rule).
func matching(p egress.Policy, name string) ([]int, bool) {
	if !plainName(name) {
		return nil, false
	}
	switch p.Mode {
	case egress.Allow:
		return nil, true
	case egress.Allowlist:
		var rules []int
		for i, r := range p.Rules {
			if r.Host != "" && egress.MatchHost(r.Host, name) {
				rules = append(rules, i)
			}
		}
		return rules, len(rules) > 0
	}
	return nil, false // Deny, or no policy
}

// plainName reports whether name (lower case) has only letters, digits,
// '-', '_' and dots: a name with escapes ("a\.example.com") must not pass
// a rule's suffix match.
func plainName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		b := name[i]
		if !(b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '-' || b == '_' || b == '.') {
			return false
		}
	}
	return true
}
