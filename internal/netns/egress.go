package netns

// Egress: workloads reach networks beyond the node (a model's API, a
// package registry) through the node, source-NATed to the node's address,
// as containers do. The kernel must forward IPv4 (net.ipv4.ip_forward, a
// host-wide setting this turns on and never off) and an nftables table of
// this bridge masquerades what leaves the workers' subnet. A host whose
// own firewall drops forwarded traffic (a FORWARD policy of drop) must
// let the subnet through itself.

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

const ipForward = "/proc/sys/net/ipv4/ip_forward"

// egressChain is the masquerading chain of the bridge's table.
const egressChain = "postrouting"

// ensureEgress turns on forwarding and (re)writes the masquerade rule:
// packets from the subnet to anywhere outside it leave with the address of
// the interface they leave by.
func (n *Network) ensureEgress() error {
	if err := os.WriteFile(ipForward, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("egress: enable IPv4 forwarding: %w", err)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("egress: nftables: %w", err)
	}
	table := c.AddTable(n.table())
	chain := c.AddChain(&nftables.Chain{
		Name: egressChain, Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
	})
	// Adding an existing table or chain keeps it; flushing the chain in
	// the same batch makes the rule set exactly one rule, atomically.
	c.FlushChain(chain)
	network := n.prefix.Addr().AsSlice()
	mask := net.CIDRMask(n.prefix.Bits(), 32)
	c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
		// ip saddr within the subnet
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: network},
		// ip daddr outside it
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: network},
		&expr.Masq{},
	}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("egress: nftables table %s: %w", n.table().Name, err)
	}
	return nil
}

// removeEgress deletes the masquerading chain, if there is one: the
// workloads reach only the node.
func (n *Network) removeEgress() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("egress: nftables: %w", err)
	}
	c.DelChain(&nftables.Chain{Name: egressChain, Table: n.table()})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("egress: delete chain %s of nftables table %s: %w", egressChain, n.table().Name, err)
	}
	return nil
}
