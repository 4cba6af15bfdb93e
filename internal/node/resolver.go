package node

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/torpor-dev/torpor/internal/dnsproxy"
)

// The node's resolver (internal/dnsproxy) answers the workloads' DNS
// queries on the gateway's port 53 (the network redirects every query
// there) with the names their policies allow, and makes the answered
// addresses reachable for the asking slot alone before it answers.

// serveResolver runs the resolver until ctx ends. One that cannot listen
// is logged, not fatal: workloads then resolve no name, and reach what
// their address rules allow.
func (a *Agent) serveResolver(ctx context.Context) error {
	g := a.machine.egress
	if g.network == nil || len(a.machine.slots) == 0 {
		<-ctx.Done()
		return nil
	}
	addr := net.JoinHostPort(a.machine.slots[0].rt.Gateway, "53")
	udp, tcp, err := listenDNS(addr)
	if err != nil {
		a.log.Error("the node's resolver is not serving: workloads resolve no name", "addr", addr, "err", err)
		<-ctx.Done()
		return nil
	}
	a.log.Info("serving the workloads' resolver", "addr", addr, "upstreams", a.cfg.DNS)
	srv := dnsproxy.New(dnsproxy.Config{
		Upstreams: a.cfg.DNS, Client: g.dnsClient, Permit: g.permit, Refused: g.refusedDNS, Logger: a.log,
	})
	return srv.Serve(ctx, udp, tcp)
}

func listenDNS(addr string) (net.PacketConn, net.Listener, error) {
	udp, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("resolver: %w", err)
	}
	tcp, err := net.Listen("tcp4", addr)
	if err != nil {
		udp.Close()
		return nil, nil, fmt.Errorf("resolver: %w", err)
	}
	return udp, tcp, nil
}

// dnsClient is the workload of the slot with address src, for the
// resolver.
func (g *egressGuard) dnsClient(src netip.Addr) (dnsproxy.Client, bool) {
	c, ok := g.client(src)
	if !ok {
		return dnsproxy.Client{}, false
	}
	return dnsproxy.Client{Key: c.worker, Policy: c.policy}, true
}

// byWorker is the workload of worker, with its slot's address.
func (g *egressGuard) byWorker(worker string) (egressClient, netip.Addr, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for ip, c := range g.clients {
		if c.worker == worker {
			return c, ip, true
		}
	}
	return egressClient{}, netip.Addr{}, false
}

// permit makes what the resolver answered reachable from c's slot.
func (g *egressGuard) permit(ctx context.Context, c dnsproxy.Client, rule int, addrs []netip.Addr, ttl time.Duration) error {
	w, _, ok := g.byWorker(c.Key)
	if !ok {
		return fmt.Errorf("worker %s hosts no workload", c.Key)
	}
	return g.network.Permit(ctx, w.index, rule, addrs, ttl)
}

// refusedDNS counts and samples a name the resolver refused c.
func (g *egressGuard) refusedDNS(c dnsproxy.Client, name string) {
	if _, ip, ok := g.byWorker(c.Key); ok {
		g.refusedName(ip, name)
	}
}
