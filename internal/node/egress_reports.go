package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/netns"
)

// Refusals. The kernel counts every packet a slot's policy refuses (an
// nftables counter per slot, exact) and logs a sample of them (NFLOG, at
// most a few a second per slot: internal/netns); the resolver tells of
// the names it refused. Every egressReportInterval the node adds the
// counts to torpor_egress_denied_total{space,actor} and reports them to
// the control plane (NodeService.ReportEgressDenied) with at most
// maxEgressSamples samples per workload, which become the actor's
// events. A report that fails is logged and dropped: refusals are
// observations, never worth holding the node for.

const (
	egressReportInterval = 2 * time.Second
	maxEgressSamples     = 5
)

// egressReporter is where refusals go (NodeService).
type egressReporter interface {
	ReportEgressDenied(context.Context, *connect.Request[torporv1.ReportEgressDeniedRequest]) (*connect.Response[torporv1.ReportEgressDeniedResponse], error)
}

// egressPending is what a workload was refused since the last report.
type egressPending struct {
	c       egressClient
	count   int64
	samples []*torporv1.EgressDenial
}

// refusalLog is a Network that logs samples of its refusals.
type refusalLog interface {
	Refusals(ctx context.Context, fn func(netns.Refused)) error
}

func (g *egressGuard) pendingOf(c egressClient) *egressPending {
	p := g.pending[c.worker]
	if p == nil || p.c.w.GetActorUid() != c.w.GetActorUid() || p.c.op != c.op {
		if p != nil && p.count > 0 {
			// The workload before it, not reported yet: kept under its own key.
			g.pending[c.worker+"\x00"+p.c.op] = p
		}
		p = &egressPending{c: c}
		g.pending[c.worker] = p
	}
	return p
}

// count adds n refusals of c's workload.
func (g *egressGuard) count(c egressClient, n uint64) {
	if n == 0 {
		return
	}
	g.mu.Lock()
	g.pendingOf(c).count += int64(n)
	g.mu.Unlock()
	if g.metric != nil {
		g.metric(c.w.GetSpace(), c.w.GetActor(), n)
	}
}

// sample keeps one refusal as a sample for its workload's events (its
// count comes from the kernel's counter, or for a name, refusedName).
func (g *egressGuard) sample(d *torporv1.EgressDenial, src netip.Addr) {
	c, ok := g.client(src)
	if !ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.pendingOf(c)
	if len(p.samples) < maxEgressSamples {
		p.samples = append(p.samples, d)
	}
}

// refusedName counts and samples a name the resolver refused.
func (g *egressGuard) refusedName(src netip.Addr, name string) {
	c, ok := g.client(src)
	if !ok {
		return
	}
	g.sample(&torporv1.EgressDenial{Time: timestamppb.Now(), Protocol: "dns", Destination: name}, src)
	g.count(c, 1)
}

// refused samples a packet the kernel logged.
func (g *egressGuard) refused(r netns.Refused) {
	proto := fmt.Sprint(r.Protocol)
	switch r.Protocol {
	case 1:
		proto = "icmp"
	case byte(egress.TCP), byte(egress.UDP):
		proto = egress.Protocol(r.Protocol).String()
	}
	g.sample(&torporv1.EgressDenial{Time: timestamppb.New(r.Time), Protocol: proto, Destination: r.Dst.String(), Port: int32(r.Port)}, r.Src)
}

// reportLoop reads the slots' counters and reports every interval until
// ctx ends.
func (g *egressGuard) reportLoop(ctx context.Context, node string, to egressReporter) error {
	if g.network == nil {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(egressReportInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		g.readCounters(ctx)
		g.report(ctx, node, to)
	}
}

func (g *egressGuard) readCounters(ctx context.Context) {
	g.mu.Lock()
	clients := make([]egressClient, 0, len(g.clients))
	for _, c := range g.clients {
		clients = append(clients, c)
	}
	g.mu.Unlock()
	for _, c := range clients {
		n, err := g.network.Denied(ctx, c.index)
		if err != nil {
			g.log.Warn("egress refusals not read", "worker", c.worker, "err", err)
			continue
		}
		g.count(c, n)
	}
}

func (g *egressGuard) report(ctx context.Context, node string, to egressReporter) {
	g.mu.Lock()
	var due []*egressPending
	for k, p := range g.pending {
		if p.count > 0 || len(p.samples) > 0 {
			due = append(due, p)
		}
		delete(g.pending, k)
	}
	g.mu.Unlock()
	for _, p := range due {
		req := &torporv1.ReportEgressDeniedRequest{
			Node: node, Worker: p.c.worker, ActorUid: p.c.w.GetActorUid(), OperationId: p.c.op,
			Count: max(p.count, int64(len(p.samples))), Samples: p.samples,
		}
		rctx, cancel := context.WithTimeout(ctx, controlPlaneTimeout)
		_, err := to.ReportEgressDenied(rctx, connect.NewRequest(req))
		cancel()
		if err != nil {
			level := g.log.Warn
			if errors.Is(errdefs.FromConnect(err), errdefs.ErrUnimplemented) {
				level = g.log.Debug
			}
			level("egress refusals not reported; dropped", "worker", p.c.worker, "actor_uid", p.c.w.GetActorUid(), "count", req.Count, "err", err)
		}
	}
}
