package netns

// The firewall: a worker's address is a way in for the node and the router
// on its host only. Anything else that could route to the workers' subnet
// through this host (another machine, another node's workers on this
// host) would otherwise reach whichever actor holds the worker's address
// at that moment: the address belongs to the slot, not the actor. Clients
// reach actors through the router instead (HTTP, and TCP tunnels), which
// finds the actor's current worker and resumes it on demand.
//
// The rule lives in the bridge's nftables table (the one egress
// masquerades in): a filter chain on the forward hook drops every packet
// forwarded into the bridge that does not belong to a connection a
// workload opened. Packets the host itself sends to a worker are not
// forwarded and pass; nothing here touches the host's own firewall.

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/egress"
)

// The base chains of the bridge's table: forward and input filters, and
// the redirection of DNS to the node's resolver.
const (
	firewallChain = "forward"
	inputChain    = "input"
	dnsChain      = "prerouting"
)

// table is the nftables table (ip family) of this node's bridge: its
// firewall and, with egress, its masquerading.
func (n *Network) table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "torpor-" + n.bridge}
}

// ensureFirewall (re)writes the forward chain, atomically: accept what
// belongs to connections the workloads opened (egress replies), drop
// anything else forwarded into the bridge.
func (n *Network) ensureFirewall() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("firewall: nftables: %w", err)
	}
	table := c.AddTable(n.table())
	chain := c.AddChain(&nftables.Chain{
		Name: firewallChain, Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter,
	})
	c.FlushChain(chain)
	intoBridge := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(n.bridge)},
	}
	c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: append(append([]expr.Any{}, intoBridge...), established()...)})
	c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: append(append([]expr.Any{}, intoBridge...),
		&expr.Verdict{Kind: expr.VerdictDrop},
	)})
	// What the slots send, beyond the node (forward) and to it (input),
	// goes by each slot's policy (policy.go).
	slots := n.slotsSet()
	if err := c.AddSet(slots, nil); err != nil {
		return fmt.Errorf("firewall: map %s: %w", slots.Name, err)
	}
	n.fromSlots(c, table, chain, slots)
	input := c.AddChain(&nftables.Chain{
		Name: inputChain, Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter,
	})
	c.FlushChain(input)
	n.fromSlots(c, table, input, slots)
	n.redirectDNS(c, table)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("firewall: nftables table %s: %w", n.table().Name, err)
	}
	return nil
}

// fromSlots adds to chain: what the slots send that answers a connection
// passes, anything else goes by the slot's chain, or is refused for a
// slot without a policy.
func (n *Network) fromSlots(c *nftables.Conn, table *nftables.Table, chain *nftables.Chain, slots *nftables.Set) {
	fromBridge := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(n.bridge)},
	}
	rule := func(e ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: append(append([]expr.Any{}, fromBridge...), e...)})
	}
	rule(established()...)
	rule(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: slots.Name, SetID: slots.ID, DestRegister: 0, IsDestRegSet: true})
	rule(&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 13})
}

// established matches packets of connections already accepted.
func established() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

// redirectDNS sends every DNS query of the slots, whatever nameserver
// they ask, to the node's resolver on the gateway.
func (n *Network) redirectDNS(c *nftables.Conn, table *nftables.Table) {
	chain := c.AddChain(&nftables.Chain{
		Name: dnsChain, Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest,
	})
	c.FlushChain(chain)
	for _, proto := range []egress.Protocol{egress.UDP, egress.TCP} {
		e := []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(n.bridge)},
		}
		e = append(append(e, l4proto(proto)...), dportIs(dnsPort)...)
		e = append(e,
			&expr.Immediate{Register: 1, Data: n.gateway.AsSlice()},
			&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(dnsPort)},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
		)
		c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: e})
	}
}

// ifname is an interface name as nftables compares it: NUL-padded to
// IFNAMSIZ.
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// removeTable deletes the bridge's nftables table, if there is one, and
// says whether there was.
func (n *Network) removeTable() (existed bool, err error) {
	c, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("nftables: %w", err)
	}
	c.DelTable(n.table())
	switch err := c.Flush(); {
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("delete nftables table %s: %w", n.table().Name, err)
	}
	return true, nil
}
