package node

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
)

// PolicyNetwork is a Network that enforces an egress policy per slot
// (internal/netns): a slot without one reaches nothing.
type PolicyNetwork interface {
	// ApplyPolicy writes slot index's policy, replacing its previous one.
	ApplyPolicy(ctx context.Context, index int, p egress.Policy) error
	// AdoptPolicy writes it only if the slot has none (a workload a
	// previous agent started keeps the addresses its resolver answered).
	AdoptPolicy(ctx context.Context, index int, p egress.Policy) error
	// Permit makes addrs reachable from the slot for ttl, under its
	// policy's host rule.
	Permit(ctx context.Context, index, rule int, addrs []netip.Addr, ttl time.Duration) error
	// ClearPolicy removes it, returning the refusals not yet read.
	ClearPolicy(ctx context.Context, index int) (denied uint64, err error)
	// Denied returns and resets the slot's count of refusals.
	Denied(ctx context.Context, index int) (uint64, error)
}

// egressHook enforces the workload's egress policy (Workload.egress: the
// effective one; none from a control plane older than policies, which
// meant Allow) in its slot's network from before it boots (or is
// restored) until it stops, and tells the node's resolver whose queries
// come from the slot.
type egressHook struct{ g *egressGuard }

func (egressHook) hookName() string { return "egress" }

func (h egressHook) starting(ctx context.Context, s *slot, w *torporv1.Workload, _ bootSource) (map[string]string, error) {
	return nil, h.g.apply(ctx, s, w, false)
}

// adopted keeps what the slot's network enforces, or writes it again
// from the slot's record if it is gone.
func (h egressHook) adopted(s *slot, w *torporv1.Workload) {
	ctx, cancel := context.WithTimeout(context.Background(), controlPlaneTimeout)
	defer cancel()
	if err := h.g.apply(ctx, s, w, true); err != nil {
		h.g.log.Error("egress policy of an adopted workload not enforced: it reaches nothing", "worker", s.name(), "actor_uid", w.GetActorUid(), "err", err)
	}
}

func (h egressHook) stopped(s *slot) error { return h.g.clear(s) }

// egressGuard is the node's part of the workloads' egress: their
// policies, whose queries the resolver answers, and the count of what
// they were refused (egress_reports.go).
type egressGuard struct {
	network PolicyNetwork // nil: the Network enforces no policy
	// ceiling false (--egress=false): every policy is Deny.
	ceiling bool
	log     *slog.Logger
	index   func(s *slot) int

	mu sync.Mutex
	// clients are the slots' workloads, by the slot's address.
	clients map[netip.Addr]egressClient
	// pending are refusals not reported yet, by worker.
	pending map[string]*egressPending
	metric  func(space, actor string, n uint64)
}

// egressClient is a slot's workload as its egress sees it.
type egressClient struct {
	worker string
	index  int
	policy egress.Policy
	w      *torporv1.Workload
	op     string
}

// PolicyOf is the policy a node enforces for w: its effective policy
// (Allow when it names none: a control plane older than policies), Deny
// when the node's ceiling (--egress=false) forbids any egress.
func PolicyOf(w *torporv1.Workload, ceiling bool) (egress.Policy, error) {
	p, err := egress.Parse(w.GetEgress(), "workload.egress")
	if err != nil {
		return egress.Policy{}, err
	}
	if p.Mode == egress.Unset {
		p = egress.Policy{Mode: egress.Allow}
	}
	if !ceiling {
		p = egress.Policy{Mode: egress.Deny}
	}
	return p, nil
}

// lowered says whether the node's ceiling makes w's policy stricter than
// the control plane asked: the start says so.
func (g *egressGuard) lowered(w *torporv1.Workload) string {
	if g.ceiling || g.network == nil {
		return ""
	}
	if p, err := PolicyOf(w, true); err == nil && p.Mode != egress.Deny {
		return fmt.Sprintf("egress: this node runs with --egress=false, so actor %s/%s reaches nothing beyond the node, whatever its %s policy allows", w.GetSpace(), w.GetActor(), p.Mode)
	}
	return ""
}

func (g *egressGuard) apply(ctx context.Context, s *slot, w *torporv1.Workload, adopt bool) error {
	if g.network == nil {
		return nil
	}
	p, err := PolicyOf(w, g.ceiling)
	if err != nil {
		return invalid("workload.egress", "%v", err)
	}
	index := g.index(s)
	write := g.network.ApplyPolicy
	if adopt {
		write = g.network.AdoptPolicy
	}
	if err := write(ctx, index, p); err != nil {
		return fmt.Errorf("actor %s/%s on worker %s: %w", w.GetSpace(), w.GetActor(), s.name(), err)
	}
	ip, err := netip.ParseAddr(s.rt.IP)
	if err != nil {
		return fmt.Errorf("worker %s: ip: %w", s.name(), err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.clients[ip] = egressClient{worker: s.name(), index: index, policy: p, w: w, op: s.current().Operation}
	return nil
}

// clear removes the slot's policy and keeps its last refusals for the
// next report.
func (g *egressGuard) clear(s *slot) error {
	if g.network == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), controlPlaneTimeout)
	defer cancel()
	ip, _ := netip.ParseAddr(s.rt.IP)
	g.mu.Lock()
	c, ok := g.clients[ip]
	delete(g.clients, ip)
	g.mu.Unlock()
	denied, err := g.network.ClearPolicy(ctx, g.index(s))
	if ok {
		g.count(c, denied)
	}
	if err != nil {
		return fmt.Errorf("worker %s: %w", s.name(), err)
	}
	return nil
}

// client is the workload of the slot with address src.
func (g *egressGuard) client(src netip.Addr) (egressClient, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.clients[src.Unmap()]
	return c, ok
}
