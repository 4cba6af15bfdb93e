// Package dnsproxy is the node's resolver for sandboxes: the one place a
// sandbox's names are resolved, so that a host rule of its egress policy
// holds however the sandbox resolves the name. Addresses alone cannot
// enforce a name rule (a CDN's addresses change, and many names share
// them); the resolver answers only the names the policy allows and, before
// it sends an answer, makes the answered IPv4 addresses reachable for that
// sandbox alone (Config.Permit), on the matching rules' protocol and ports,
// for the answer's TTL clamped to [MinTTL, MaxTTL]. The answer's TTLs are
// lowered to the permitted TTL, so the sandbox never caches an address
// longer than the firewall lets it through.
//
// What it answers, for a client (identified by the query's source address,
// Config.Client) whose policy allows the name (ALLOW: every name;
// ALLOWLIST: a host rule egress.MatchHost matches; DENY or no policy:
// none):
//   - A: forwarded to the upstreams (each tried in turn with a timeout, over
//     TCP when the UDP answer is truncated); the CNAME chain of the name is
//     kept, and of its A records only the egress.Public ones. Permit is
//     called for every matching rule (ALLOWLIST). An answer whose
//     addresses were all protected (10.x, 127.x, 169.254.x...) is REFUSED
//     and counted with Config.Refused: an allowed name that points inside
//     is not made reachable.
//   - AAAA: forwarded, its AAAA records removed (sandboxes have IPv4 only).
//   - other types (MX, TXT, SRV, PTR...): forwarded, address records
//     removed; nothing is permitted (only A answers become reachable).
//
// What it refuses: an unknown source, a name the policy does not allow
// (REFUSED, and Config.Refused), a name with characters other than
// letters, digits, '-', '_' and '.' (escapes cannot match a rule), ANY and
// zone transfers, a class other than IN (REFUSED); another opcode
// (NOTIMP); several questions or a name over 253 bytes (FORMERR). The
// additional section is never forwarded (no glue addresses), the authority
// section only for its SOA (negative caching). A Permit error or no usable
// upstream answer is SERVFAIL.
package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/torpor-dev/torpor/internal/egress"
)

// MinTTL and MaxTTL bound how long an answer's addresses are permitted.
const (
	MinTTL = 5 * time.Second
	MaxTTL = time.Hour
)

// defaultTimeout is one upstream try's, when Config.Timeout is zero.
const defaultTimeout = 2 * time.Second

// maxInflight bounds the queries answered at once; more are REFUSED.
const maxInflight = 256

// Client is the sandbox a query came from.
type Client struct {
	Key    string // slot/worker name
	Policy egress.Policy
}

// Config is what the resolver needs from the node.
type Config struct {
	// Upstreams are "ip:port" resolvers allowed names are forwarded to.
	Upstreams []string
	// Client says who sent a query, by its source address.
	Client func(src netip.Addr) (Client, bool)
	// Permit makes addrs reachable for c on rule's protocol and ports for
	// ttl; called before the answer is sent, an error is SERVFAIL.
	Permit func(ctx context.Context, c Client, rule int, addrs []netip.Addr, ttl time.Duration) error
	// Refused is told of a name the client's policy does not allow (or
	// whose addresses were all protected).
	Refused func(c Client, name string)
	Logger  *slog.Logger
	// Timeout is one upstream try's; zero is 2 s.
	Timeout time.Duration
}

// Server is the resolver.
type Server struct {
	cfg      Config
	log      *slog.Logger
	inflight chan struct{}
	udp, tcp *dns.Client
}

// New returns a resolver; Serve runs it.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.Refused == nil {
		cfg.Refused = func(Client, string) {}
	}
	return &Server{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "dnsproxy"),
		inflight: make(chan struct{}, maxInflight),
		udp:      &dns.Client{Net: "udp", Timeout: cfg.Timeout, UDPSize: upstreamUDPSize},
		tcp:      &dns.Client{Net: "tcp", Timeout: cfg.Timeout},
	}
}

// Serve answers queries on udp and tcp (it closes both) until ctx ends or
// one of them fails, and returns after every goroutine it started,
// including those answering queries, is done.
func (s *Server) Serve(ctx context.Context, udp net.PacketConn, tcp net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) { s.serveDNS(ctx, w, req) })
	servers := []*dns.Server{
		{PacketConn: udp, Handler: handler, UDPSize: upstreamUDPSize},
		{Listener: tcp, Handler: handler},
	}
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, srv := range servers {
		started, done := make(chan struct{}), make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		wg.Go(func() {
			defer close(done)
			defer cancel() // one ended: stop the other
			if err := srv.ActivateAndServe(); err != nil && ctx.Err() == nil {
				errs[i] = fmt.Errorf("dns server %d: %w", i, err)
			}
		})
		wg.Go(func() {
			select {
			case <-started:
			case <-done:
				return
			}
			<-ctx.Done()
			_ = srv.Shutdown() // waits for the queries being answered
		})
	}
	wg.Wait()
	if udp != nil {
		_ = udp.Close()
	}
	if tcp != nil {
		_ = tcp.Close()
	}
	return errors.Join(errs...)
}
