package netns

// Egress policy per slot (issue #28). Every packet a slot sends that the
// node forwards (beyond it) or receives (to one of the node's own
// addresses) and that opens no reply to a connection the node made goes
// through the slot's chain, "slot-<index>", which the bridge's map of
// slots ("slots": the slot's address -> jump) sends it to:
//
//  1. queries to the node's resolver (every DNS packet was redirected to
//     it, prerouting) pass;
//  2. address rules pass on their protocol and ports, for their range
//     without the protected ranges the rule does not lie inside
//     (egress.Inside): a rule of 10.0.0.0/8 reaches 10/8 but not the
//     workers' subnet in it, nor the node;
//  3. the node's own addresses (fib: whatever they are when the packet
//     goes) and the protected ranges (egress.Protected, the workers'
//     subnet, the node's addresses when the policy was written) are
//     refused;
//  4. ALLOW passes the rest; ALLOWLIST passes, per host rule, the
//     addresses the node's resolver answered for that rule to this slot
//     (the set "slot-<index>-r<rule>", each address with its answer's
//     TTL as timeout) on the rule's protocol and ports;
//  5. anything else is refused: counted ("slot-<index>-denied", exactly),
//     logged to NFLOG group RefusalGroup (at most refusalLogRate a second
//     per slot: samples, see refusals.go) and rejected, TCP with a reset,
//     anything else with ICMP administratively prohibited.
//
// A slot the map does not hold (no workload, or a workload whose policy
// was not written yet) reaches nothing.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/egress"
)

// slotsMap is the bridge's verdict map from a slot's address to its chain.
const slotsMap = "slots"

// refusalLogRate bounds the refusals of one slot logged a second (their
// count is exact: the slot's counter).
const (
	refusalLogRate  = 10
	refusalLogBurst = 20
	// refusalSnaplen copies the IPv4 header and the ports.
	refusalSnaplen = 64
)

// Resolver port on the gateway.
const dnsPort = 53

func (n *Network) slotChain(index int) string { return "slot-" + strconv.Itoa(index) }
func (n *Network) denyChain(index int) string { return "slot-" + strconv.Itoa(index) + "-deny" }
func (n *Network) counter(index int) string   { return "slot-" + strconv.Itoa(index) + "-denied" }
func (n *Network) hostSet(index, rule int) string {
	return fmt.Sprintf("slot-%d-r%d", index, rule)
}

// slotsSet is the bridge's map of slots.
func (n *Network) slotsSet() *nftables.Set {
	return &nftables.Set{Table: n.table(), Name: slotsMap, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
}

// protected are the ranges no rule reaches unless it lies inside one:
// egress.Protected, the workers' subnet and the node's addresses.
func (n *Network) protected() []netip.Prefix {
	out := append([]netip.Prefix{n.prefix}, egress.Protected...)
	addrs, _ := netlink.AddrList(nil, unix.AF_INET)
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			out = append(out, netip.PrefixFrom(ip, 32))
		}
	}
	return out
}

// ApplyPolicy writes slot index's policy, replacing any it had, in one
// batch: from its end the slot's packets go by p only. Host rules start
// with no address (Permit adds them).
func (n *Network) ApplyPolicy(ctx context.Context, index int, p egress.Policy) error {
	ip, err := n.IP(index)
	if err != nil {
		return fmt.Errorf("egress policy: %w", err)
	}
	c, err := batchConn()
	if err != nil {
		return fmt.Errorf("egress policy of slot %d: nftables: %w", index, err)
	}
	stale, err := n.slotSets(c, index)
	if err != nil {
		return err
	}
	table := c.AddTable(n.table())
	chain := c.AddChain(&nftables.Chain{Name: n.slotChain(index), Table: table})
	deny := c.AddChain(&nftables.Chain{Name: n.denyChain(index), Table: table})
	c.FlushChain(chain)
	c.FlushChain(deny)
	for _, s := range stale {
		c.DelSet(s)
	}
	c.AddObj(&nftables.CounterObj{Table: table, Name: n.counter(index)})
	r := ruleWriter{c: c, table: table, chain: chain}
	if err := n.writeSlotRules(&r, index, p); err != nil {
		return err
	}
	n.writeDenyRules(c, table, deny, index)
	if err := c.SetAddElements(n.slotsSet(), []nftables.SetElement{{
		Key: ip.AsSlice(), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: n.slotChain(index)},
	}}); err != nil {
		return fmt.Errorf("egress policy of slot %d: %w", index, err)
	}
	if r.err != nil {
		return fmt.Errorf("egress policy of slot %d: %w", index, r.err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("egress policy of slot %d (%s): nftables table %s: %w", index, p.Mode, n.table().Name, err)
	}
	return nil
}

// AdoptPolicy writes slot index's policy unless it has one: a workload
// a previous agent started keeps the addresses the resolver answered it.
func (n *Network) AdoptPolicy(ctx context.Context, index int, p egress.Policy) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("egress policy of slot %d: nftables: %w", index, err)
	}
	if _, err := c.ListChain(n.table(), n.slotChain(index)); err == nil {
		return nil
	}
	return n.ApplyPolicy(ctx, index, p)
}

func (n *Network) writeSlotRules(r *ruleWriter, index int, p egress.Policy) error {
	gw := n.gateway.AsSlice()
	for _, proto := range []egress.Protocol{egress.UDP, egress.TCP} {
		r.add(append(append(daddrIs(gw), l4proto(proto)...), dportIs(dnsPort)...), accept())
	}
	protected := n.protected()
	for _, rule := range p.Rules {
		if rule.Host != "" || p.Mode != egress.Allowlist {
			continue
		}
		var cut []span
		for _, pr := range protected {
			if !egress.Inside(rule.Prefix, []netip.Prefix{pr}) {
				cut = append(cut, prefixSpan(pr))
			}
		}
		spans := subtract([]span{prefixSpan(rule.Prefix)}, union(cut))
		if len(spans) == 0 {
			continue
		}
		addrs := r.anonymous(nftables.TypeIPAddr, intervalElements(spans, 4))
		r.add(append(append(daddrIn(addrs), l4proto(rule.Protocol)...), r.ports(rule)...), accept())
	}
	goDeny := &expr.Verdict{Kind: expr.VerdictGoto, Chain: n.denyChain(index)}
	r.add([]expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}, goDeny)
	var prot []span
	for _, pr := range protected {
		prot = append(prot, prefixSpan(pr))
	}
	r.add(daddrIn(r.anonymous(nftables.TypeIPAddr, intervalElements(union(prot), 4))), goDeny)
	switch p.Mode {
	case egress.Allow:
		r.add(nil, accept())
	case egress.Allowlist:
		for i, rule := range p.Rules {
			if rule.Host == "" {
				continue
			}
			set := &nftables.Set{Table: r.table, Name: n.hostSet(index, i), KeyType: nftables.TypeIPAddr, HasTimeout: true}
			if err := r.c.AddSet(set, nil); err != nil {
				return fmt.Errorf("egress policy of slot %d: rule %d: %w", index, i, err)
			}
			r.add(append(append(daddrIn(set), l4proto(rule.Protocol)...), r.ports(rule)...), accept())
		}
	}
	r.add(nil, goDeny)
	return nil
}

// writeDenyRules fills the slot's refusal chain: count, log a sample,
// reject.
func (n *Network) writeDenyRules(c *nftables.Conn, table *nftables.Table, deny *nftables.Chain, index int) {
	add := func(e ...expr.Any) { c.AddRule(&nftables.Rule{Table: table, Chain: deny, Exprs: e}) }
	add(&expr.Objref{Type: 1 /* NFT_OBJECT_COUNTER */, Name: n.counter(index)})
	add(&expr.Limit{Type: expr.LimitTypePkts, Rate: refusalLogRate, Unit: expr.LimitTimeSecond, Burst: refusalLogBurst},
		&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_SNAPLEN, Group: n.RefusalGroup(), Snaplen: refusalSnaplen})
	add(append(l4proto(egress.TCP), &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})...)
	add(&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 13 /* ICMP_PKT_FILTERED: administratively prohibited */})
}

// RefusalGroup is the NFLOG group of this bridge's refusals, derived
// from its name: agents sharing a host have distinct bridges.
func (n *Network) RefusalGroup() uint16 {
	var h uint32 = 2166136261
	for _, b := range []byte(n.bridge) {
		h = (h ^ uint32(b)) * 16777619
	}
	// Clear of the low groups other software tends to use.
	return uint16(1024 + h%(65535-1024))
}

// Permit makes addrs reachable from slot index for ttl under its policy's
// rule (a host rule), as the resolver answered them.
func (n *Network) Permit(ctx context.Context, index, rule int, addrs []netip.Addr, ttl time.Duration) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("permit for slot %d: nftables: %w", index, err)
	}
	var elems []nftables.SetElement
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() {
			elems = append(elems, nftables.SetElement{Key: a.AsSlice(), Timeout: ttl})
		}
	}
	if len(elems) == 0 {
		return nil
	}
	set := &nftables.Set{Table: n.table(), Name: n.hostSet(index, rule), KeyType: nftables.TypeIPAddr, HasTimeout: true}
	if err := c.SetAddElements(set, elems); err != nil {
		return fmt.Errorf("permit for slot %d, rule %d: %w", index, rule, err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("permit for slot %d, rule %d: set %s: %w", index, rule, set.Name, err)
	}
	return nil
}

// ClearPolicy removes slot index's policy: its packets reach nothing
// until the next ApplyPolicy. It returns the refusals counted since the
// last Denied. No error if there is none.
func (n *Network) ClearPolicy(ctx context.Context, index int) (denied uint64, err error) {
	denied, _ = n.Denied(ctx, index)
	c, err := nftables.New()
	if err != nil {
		return denied, fmt.Errorf("egress policy of slot %d: nftables: %w", index, err)
	}
	ip, err := n.IP(index)
	if err != nil {
		return denied, fmt.Errorf("egress policy: %w", err)
	}
	type removal struct {
		what  string
		queue func()
	}
	removals := []removal{
		{"map element", func() { _ = c.SetDeleteElements(n.slotsSet(), []nftables.SetElement{{Key: ip.AsSlice()}}) }},
	}
	for _, ch := range []string{n.slotChain(index), n.denyChain(index)} {
		removals = append(removals, removal{"chain " + ch, func() { c.FlushChain(&nftables.Chain{Name: ch, Table: n.table()}) }})
	}
	for _, ch := range []string{n.slotChain(index), n.denyChain(index)} {
		removals = append(removals, removal{"chain " + ch, func() { c.DelChain(&nftables.Chain{Name: ch, Table: n.table()}) }})
	}
	sets, err := n.slotSets(c, index)
	errs := []error{err}
	for _, s := range sets {
		removals = append(removals, removal{"set " + s.Name, func() { c.DelSet(s) }})
	}
	removals = append(removals, removal{"counter", func() { c.DeleteObject(&nftables.CounterObj{Table: n.table(), Name: n.counter(index)}) }})
	defer n.forgetConnections(ip)
	// One transaction: each costs the kernel a grace period (about
	// 10 ms here), on the path of every suspend and pause.
	for _, r := range removals {
		r.queue()
	}
	if c.Flush() == nil {
		return denied, errors.Join(errs...)
	}
	// Something was gone already (a policy half removed before), which
	// fails the whole batch: each on its own, so that one that is gone
	// does not keep the others.
	for _, r := range removals {
		r.queue()
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("egress policy of slot %d: remove %s: %w", index, r.what, err))
		}
	}
	return denied, errors.Join(errs...)
}

// Denied returns, and resets, the count of slot index's refusals.
func (n *Network) Denied(ctx context.Context, index int) (uint64, error) {
	c, err := nftables.New()
	if err != nil {
		return 0, fmt.Errorf("egress refusals of slot %d: nftables: %w", index, err)
	}
	obj, err := c.ResetObject(&nftables.CounterObj{Table: n.table(), Name: n.counter(index)})
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, nil
		}
		return 0, fmt.Errorf("egress refusals of slot %d: counter %s: %w", index, n.counter(index), err)
	}
	if co, ok := obj.(*nftables.CounterObj); ok {
		return co.Packets, nil
	}
	return 0, nil
}

// slotSets lists the host sets of slot index's policy.
func (n *Network) slotSets(c *nftables.Conn, index int) ([]*nftables.Set, error) {
	sets, err := c.GetSets(n.table())
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("egress policy of slot %d: list sets: %w", index, err)
	}
	var out []*nftables.Set
	prefix := fmt.Sprintf("slot-%d-r", index)
	for _, s := range sets {
		if strings.HasPrefix(s.Name, prefix) {
			out = append(out, s)
		}
	}
	return out, nil
}

// forgetConnections drops the kernel's connection tracking of ip's
// connections (best effort: without it, a former workload's connection
// lives on as "established" until it times out).
func (n *Network) forgetConnections(ip netip.Addr) {
	f := &netlink.ConntrackFilter{}
	if err := f.AddIP(netlink.ConntrackOrigSrcIP, ip.AsSlice()); err == nil {
		_, _ = netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f)
	}
}

// ruleWriter adds rules to one chain, with their anonymous sets.
type ruleWriter struct {
	c     *nftables.Conn
	table *nftables.Table
	chain *nftables.Chain
	err   error
}

func (r *ruleWriter) add(match []expr.Any, verdict expr.Any) {
	r.c.AddRule(&nftables.Rule{Table: r.table, Chain: r.chain, Exprs: append(append([]expr.Any{}, match...), verdict)})
}

// anonymous adds a constant interval set of elems.
func (r *ruleWriter) anonymous(key nftables.SetDatatype, elems []nftables.SetElement) *nftables.Set {
	s := &nftables.Set{Table: r.table, Anonymous: true, Constant: true, Interval: true, KeyType: key}
	if err := r.c.AddSet(s, elems); err != nil && r.err == nil {
		r.err = err
	}
	return s
}

// ports matches a rule's destination ports (none for every port).
func (r *ruleWriter) ports(rule egress.Rule) []expr.Any {
	var ss []span
	for _, pr := range rule.Ports {
		ss = append(ss, span{uint32(pr.First), uint32(pr.Last)})
	}
	if len(ss) == 1 && ss[0] == (span{1, 65535}) {
		return nil
	}
	set := r.anonymous(nftables.TypeInetService, intervalElements(ss, 2))
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

func accept() expr.Any { return &expr.Verdict{Kind: expr.VerdictAccept} }

func daddr() expr.Any {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
}

func daddrIs(ip []byte) []expr.Any {
	return []expr.Any{daddr(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ip}}
}

func daddrIn(s *nftables.Set) []expr.Any {
	return []expr.Any{daddr(), &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}}
}

func l4proto(p egress.Protocol) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(p)}},
	}
}

func dportIs(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// batchReadBuffer holds the kernel's acknowledgements of one slot's batch
// (a few per rule: up to egress.MaxRules rules); the default buffer
// overflows (ENOBUFS) at some fifty.
const batchReadBuffer = 8 << 20

// batchConn is an nftables connection for a large batch.
func batchConn() (*nftables.Conn, error) {
	return nftables.New(nftables.WithSockOptions(func(c *mdnetlink.Conn) error {
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			// FORCE: past net.core.rmem_max (the agent runs as root).
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, batchReadBuffer)
		}); err != nil {
			return err
		}
		return serr
	}))
}
