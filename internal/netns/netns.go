// Package netns gives each worker slot of a node its own network: a named
// network namespace holding one end of a veth pair whose other end sits on
// the node's bridge. Every workload gets its own IP and can listen on any
// port; the host reaches it directly at that IP, and nothing beyond the
// host does (firewall.go). Workloads cannot reach each other (the bridge
// ports are isolated), and reach beyond the node only with Config.Egress.
//
// Namespaces and links are long-lived: made once per slot, kept across node
// agent restarts while workloads run in them (Slot adopts what exists),
// removed by TeardownAll when the agent stops with none left (Slot makes
// them again).
package netns

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/runtime"
)

// Defaults of Config.
const (
	DefaultBridge = "torpor0"
	DefaultCIDR   = "10.213.0.0/16"
)

// Dir is where named namespaces are bind-mounted (the iproute2 convention,
// so `ip netns` sees them).
const Dir = "/var/run/netns"

// guestLink is the workload's interface name inside its namespace.
const guestLink = "eth0"

// maxSlots keeps host link names (tag + decimal index) within the kernel's
// 15 bytes.
const maxSlots = 1_000_000

// Config configures a node's worker network.
type Config struct {
	// Node names the node agent. It is part of every namespace and link
	// name, so two agents on one host never touch each other's.
	Node string
	// Bridge is the node bridge's name; default DefaultBridge. Agents
	// sharing a host need distinct bridges and CIDRs.
	Bridge string
	// CIDR is the workers' subnet; default DefaultCIDR. The bridge gets
	// the first address (the gateway), slot i the (i+2)-th.
	CIDR string
	// Egress lets workloads reach beyond the node, masqueraded as it
	// (egress.go). Without it they reach only the node.
	Egress bool
}

// Network manages one node's bridge and slot namespaces.
type Network struct {
	node    string
	bridge  string
	prefix  netip.Prefix
	gateway netip.Addr
	// linkTag keeps host-side veth names (at most 15 bytes) unique per node.
	linkTag string
	egress  bool
}

// New validates cfg; it changes nothing on the host.
func New(cfg Config) (*Network, error) {
	if cfg.Bridge == "" {
		cfg.Bridge = DefaultBridge
	}
	if cfg.CIDR == "" {
		cfg.CIDR = DefaultCIDR
	}
	if err := validName(cfg.Node); err != nil {
		return nil, fmt.Errorf("netns config: node: %w", err)
	}
	if len(cfg.Bridge) > 15 || strings.ContainsAny(cfg.Bridge, "/ \t\n") {
		return nil, fmt.Errorf("netns config: bridge %q is not a valid interface name (at most 15 bytes, no spaces or slashes)", cfg.Bridge)
	}
	prefix, err := netip.ParsePrefix(cfg.CIDR)
	if err != nil {
		return nil, fmt.Errorf("netns config: cidr: %w", err)
	}
	if !prefix.Addr().Is4() || prefix.Bits() > 30 {
		return nil, fmt.Errorf("netns config: cidr %s: need an IPv4 subnet of at least 4 addresses", cfg.CIDR)
	}
	prefix = prefix.Masked()
	h := fnv.New32a()
	h.Write([]byte(cfg.Node))
	return &Network{
		node:    cfg.Node,
		bridge:  cfg.Bridge,
		prefix:  prefix,
		gateway: prefix.Addr().Next(),
		linkTag: fmt.Sprintf("tv%06x", h.Sum32()&0xffffff),
		egress:  cfg.Egress,
	}, nil
}

func validName(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > 200 {
		return fmt.Errorf("%q is longer than 200 bytes", s)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return fmt.Errorf("%q: only letters, digits, '-', '.' and '_' are allowed", s)
		}
	}
	return nil
}

// Gateway is the bridge's address, the workers' default route.
func (n *Network) Gateway() netip.Addr { return n.gateway }

// IP is the address of slot index.
func (n *Network) IP(index int) (netip.Addr, error) {
	// .0 is the network, .1 the gateway, the last address the broadcast.
	max := min(1<<(32-n.prefix.Bits())-3, maxSlots)
	if index < 0 || index >= max {
		return netip.Addr{}, fmt.Errorf("slot index %d: subnet %s holds slots 0..%d", index, n.prefix, max-1)
	}
	a := n.prefix.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(index) + 2
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), nil
}

func (n *Network) nsName(index int) string   { return fmt.Sprintf("torpor-%s-%d", n.node, index) }
func (n *Network) nsPath(index int) string   { return filepath.Join(Dir, n.nsName(index)) }
func (n *Network) hostLink(index int) string { return n.linkTag + strconv.Itoa(index) }

// EnsureBridge creates the bridge with the gateway address, or checks the
// existing one.
func (n *Network) EnsureBridge(ctx context.Context) error {
	link, err := netlink.LinkByName(n.bridge)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: n.bridge}}
		if err := netlink.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("bridge %s: create: %w", n.bridge, err)
		}
		if link, err = netlink.LinkByName(n.bridge); err != nil {
			return fmt.Errorf("bridge %s: %w", n.bridge, err)
		}
	case err != nil:
		return fmt.Errorf("bridge %s: %w", n.bridge, err)
	}
	if link.Type() != "bridge" {
		return fmt.Errorf("bridge %s: link exists but is a %s, not a bridge", n.bridge, link.Type())
	}
	gw := &netlink.Addr{IPNet: &net.IPNet{IP: n.gateway.AsSlice(), Mask: net.CIDRMask(n.prefix.Bits(), 32)}}
	if err := netlink.AddrReplace(link, gw); err != nil {
		return fmt.Errorf("bridge %s: address %s: %w", n.bridge, gw.IPNet, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("bridge %s: up: %w", n.bridge, err)
	}
	if err := n.ensureFirewall(); err != nil {
		return err
	}
	if n.egress {
		return n.ensureEgress()
	}
	return n.removeEgress()
}

// Slot returns slot index's network, named name for the caller's logs,
// creating whatever is missing. An existing namespace with its veth is kept
// as it is: a workload may be running in it.
func (n *Network) Slot(ctx context.Context, name string, index int) (runtime.Slot, error) {
	ip, err := n.IP(index)
	if err != nil {
		return runtime.Slot{}, fmt.Errorf("worker %s: %w", name, err)
	}
	slot := runtime.Slot{
		Name: name, NetNS: n.nsPath(index), IP: ip.String(),
		PrefixLen: n.prefix.Bits(), Gateway: n.gateway.String(),
	}
	if err := n.EnsureBridge(ctx); err != nil {
		return runtime.Slot{}, fmt.Errorf("worker %s: %w", name, err)
	}
	if n.intact(index) {
		// Slots made before ports were isolated are isolated now.
		if err := n.isolate(index); err != nil {
			return runtime.Slot{}, fmt.Errorf("worker %s: %w", name, err)
		}
		return slot, nil
	}
	// Half-made (a crash during setup) or damaged: start over.
	if err := n.Teardown(ctx, index); err != nil {
		return runtime.Slot{}, fmt.Errorf("worker %s: %w", name, err)
	}
	if err := n.create(index); err != nil {
		return runtime.Slot{}, errors.Join(fmt.Errorf("worker %s: %w", name, err), n.Teardown(ctx, index))
	}
	if err := Configure(ctx, slot); err != nil {
		return runtime.Slot{}, errors.Join(fmt.Errorf("worker %s: %w", name, err), n.Teardown(ctx, index))
	}
	return slot, nil
}

// intact reports whether slot index's namespace is mounted and its veth is
// on the bridge, tagged as this slot's.
func (n *Network) intact(index int) bool {
	if !isNSMount(n.nsPath(index)) {
		return false
	}
	link, err := netlink.LinkByName(n.hostLink(index))
	if err != nil || link.Attrs().Alias != n.nsName(index) {
		return false
	}
	br, err := netlink.LinkByName(n.bridge)
	return err == nil && link.Attrs().MasterIndex == br.Attrs().Index && link.Attrs().Flags&net.FlagUp != 0
}

func (n *Network) create(index int) error {
	path := n.nsPath(index)
	if err := newNamedNS(path); err != nil {
		return err
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("namespace %s: %w", path, err)
	}
	defer ns.Close()
	br, err := netlink.LinkByName(n.bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", n.bridge, err)
	}
	host := n.hostLink(index)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: host, MasterIndex: br.Attrs().Index},
		PeerName:      guestLink,
		PeerNamespace: netlink.NsFd(ns),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s: create: %w", host, err)
	}
	link, err := netlink.LinkByName(host)
	if err != nil {
		return fmt.Errorf("veth %s: %w", host, err)
	}
	// The alias ties the link to its namespace, so Slot can tell an intact
	// slot from a stale link left by someone else with the same name.
	if err := netlink.LinkSetAlias(link, n.nsName(index)); err != nil {
		return fmt.Errorf("veth %s: alias: %w", host, err)
	}
	if err := n.isolate(index); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("veth %s: up: %w", host, err)
	}
	return nil
}

// isolate makes slot index's bridge port an isolated one: it reaches the
// bridge (the node) but no other isolated port, so one actor cannot reach
// another's workload directly.
func (n *Network) isolate(index int) error {
	link, err := netlink.LinkByName(n.hostLink(index))
	if err != nil {
		return fmt.Errorf("veth %s: %w", n.hostLink(index), err)
	}
	if err := netlink.LinkSetIsolated(link, true); err != nil {
		return fmt.Errorf("veth %s: isolate: %w", n.hostLink(index), err)
	}
	return nil
}

// Configure gives the slot's guest interface its address, brings it and
// loopback up and routes everything via the gateway. Idempotent. Call it
// only while no sandbox runs in the namespace: runsc takes the address off
// the interface when a sandbox starts (the sandbox then owns it), and
// putting it back under a live sandbox would make the host kernel answer
// for the workload.
func Configure(ctx context.Context, slot runtime.Slot) error {
	ip, err := netip.ParseAddr(slot.IP)
	if err != nil {
		return fmt.Errorf("slot %s: ip: %w", slot.Name, err)
	}
	gw, err := netip.ParseAddr(slot.Gateway)
	if err != nil {
		return fmt.Errorf("slot %s: gateway: %w", slot.Name, err)
	}
	if !ip.Is4() || !gw.Is4() || slot.PrefixLen <= 0 || slot.PrefixLen > 32 {
		return fmt.Errorf("slot %s: need IPv4 ip and gateway and a prefix length in 1..32, got %s, %s, /%d", slot.Name, ip, gw, slot.PrefixLen)
	}
	ns, err := netns.GetFromPath(slot.NetNS)
	if err != nil {
		return fmt.Errorf("slot %s: namespace %q: %w", slot.Name, slot.NetNS, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("slot %s: netlink in %s: %w", slot.Name, slot.NetNS, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("slot %s: lo: %w", slot.Name, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("slot %s: lo up: %w", slot.Name, err)
	}
	eth, err := h.LinkByName(guestLink)
	if err != nil {
		return fmt.Errorf("slot %s: %s in %s: %w", slot.Name, guestLink, slot.NetNS, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(slot.PrefixLen, 32)}}
	if err := h.AddrReplace(eth, addr); err != nil {
		return fmt.Errorf("slot %s: address %s: %w", slot.Name, addr.IPNet, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("slot %s: %s up: %w", slot.Name, guestLink, err)
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw.AsSlice()}
	if err := h.RouteReplace(route); err != nil {
		return fmt.Errorf("slot %s: default route via %s: %w", slot.Name, gw, err)
	}
	return nil
}

// Teardown removes slot index's veth and namespace; no error if they are
// already gone. A sandbox still running in the namespace keeps it alive
// until it exits, but it is unreachable.
func (n *Network) Teardown(ctx context.Context, index int) error {
	_, err := n.teardown(index)
	return err
}

// teardown is Teardown, naming what it removed.
func (n *Network) teardown(index int) (removed []string, err error) {
	var errs []error
	host := n.hostLink(index)
	if link, err := netlink.LinkByName(host); err == nil {
		// Deleting one end deletes the peer in the namespace too.
		if err := netlink.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("veth %s: delete: %w", host, err))
		} else {
			removed = append(removed, "veth "+host)
		}
	}
	path := n.nsPath(index)
	if _, err := os.Lstat(path); err == nil {
		if err := removeNamedNS(path); err != nil {
			errs = append(errs, err)
		} else {
			removed = append(removed, "network namespace "+path)
		}
	}
	return removed, errors.Join(errs...)
}

// TeardownAll removes every slot namespace of this node (found by name, so
// slots of an earlier, larger configuration go too), the bridge and its
// nftables table: all of the node's network, which Slot makes again.
func (n *Network) TeardownAll(ctx context.Context) error {
	_, err := n.RemoveAll(ctx)
	return err
}

// RemoveAll is TeardownAll, naming what it removed.
func (n *Network) RemoveAll(ctx context.Context) (removed []string, err error) {
	var errs []error
	for _, index := range n.existingSlots() {
		r, err := n.teardown(index)
		removed = append(removed, r...)
		errs = append(errs, err)
	}
	if link, err := netlink.LinkByName(n.bridge); err == nil {
		if err := netlink.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("bridge %s: delete: %w", n.bridge, err))
		} else {
			removed = append(removed, "bridge "+n.bridge)
		}
	}
	existed, err := n.removeTable()
	if existed {
		removed = append(removed, "nftables table ip "+n.table().Name)
	}
	errs = append(errs, err)
	return removed, errors.Join(errs...)
}

// existingSlots lists the slot indexes this node has a namespace file or a
// veth for.
func (n *Network) existingSlots() []int {
	seen := map[int]bool{}
	prefix := fmt.Sprintf("torpor-%s-", n.node)
	entries, _ := os.ReadDir(Dir)
	for _, e := range entries {
		if i, err := strconv.Atoi(strings.TrimPrefix(e.Name(), prefix)); err == nil && strings.HasPrefix(e.Name(), prefix) && i >= 0 {
			seen[i] = true
		}
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		name := l.Attrs().Name
		if i, err := strconv.Atoi(strings.TrimPrefix(name, n.linkTag)); err == nil && strings.HasPrefix(name, n.linkTag) && i >= 0 {
			seen[i] = true
		}
	}
	out := make([]int, 0, len(seen))
	for i := range seen {
		out = append(out, i)
	}
	return out
}

// newNamedNS creates a network namespace and bind-mounts it at path.
func newNamedNS(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("namespace %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("namespace %s: %w", path, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread enters the new namespace and is never unlocked, so Go
		// discards it when this goroutine ends instead of reusing a thread
		// in the wrong namespace.
		goruntime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("namespace %s: unshare: %w", path, err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("namespace %s: bind mount: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

func removeNamedNS(path string) error {
	// Mounts may be stacked if two setups raced; remove them all.
	for unix.Unmount(path, unix.MNT_DETACH) == nil {
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("namespace %s: remove: %w", path, err)
	}
	return nil
}

func isNSMount(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}
