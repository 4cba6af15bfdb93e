package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/miekg/dns"
)

// upstreamUDPSize is the EDNS size asked of upstreams and offered to
// clients (the DNS flag day's 1232 bytes: no IP fragmentation).
const upstreamUDPSize = 1232

// forward asks each upstream in turn, over TCP when the UDP answer is
// truncated, and returns the first answer that is not a failure
// (SERVFAIL, REFUSED) for this question.
func (s *Server) forward(ctx context.Context, q dns.Question) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(q.Name, q.Qtype)
	m.SetEdns0(upstreamUDPSize, false)
	var errs []error
	for _, up := range s.cfg.Upstreams {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		r, err := s.exchange(ctx, m, up)
		if err != nil {
			errs = append(errs, fmt.Errorf("upstream %s: %w", up, err))
			continue
		}
		if len(r.Question) != 1 || !strings.EqualFold(r.Question[0].Name, q.Name) || r.Question[0].Qtype != q.Qtype {
			errs = append(errs, fmt.Errorf("upstream %s: answered another question", up))
			continue
		}
		if r.Rcode == dns.RcodeServerFailure || r.Rcode == dns.RcodeRefused {
			errs = append(errs, fmt.Errorf("upstream %s: %s", up, dns.RcodeToString[r.Rcode]))
			continue
		}
		return r, nil
	}
	if len(errs) == 0 {
		return nil, errors.New("no upstream resolver configured")
	}
	return nil, errors.Join(errs...)
}

func (s *Server) exchange(ctx context.Context, m *dns.Msg, up string) (*dns.Msg, error) {
	r, _, err := s.udp.ExchangeContext(ctx, m, up)
	if err == nil && r.Truncated {
		r, _, err = s.tcp.ExchangeContext(ctx, m, up)
	}
	return r, err
}
