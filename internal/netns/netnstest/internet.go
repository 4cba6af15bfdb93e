package netnstest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// Internet is a test "internet": a network namespace that holds every
// address of the documentation ranges (192.0.2.0/24, 198.51.100.0/24,
// 203.0.113.0/24) this host has no route to already (a host may live in
// one: a test uses Ranges, never a range by name), routed to from this
// host over a veth, with TCP and UDP echo servers on TCPPorts and
// UDPPorts of every address. Each answers with the address the connection
// (or datagram) came from, and a newline.
type Internet struct {
	// Ranges are the documentation ranges it holds: at least two.
	Ranges []netip.Prefix
	// NodeIP is this host's end of the link (one of the node's own
	// addresses), IP the internet's.
	NodeIP, IP string
	TCPPorts   []int
	UDPPorts   []int
	// NS is the path of its network namespace.
	NS string
}

// The echo servers' ports.
var (
	InternetTCPPorts = []int{443, 8443, 9000}
	InternetUDPPorts = []int{443, 9000}
)

// lockPath serializes the processes that make an Internet: the routes to
// the documentation ranges are host-wide.
const lockPath = "/run/torpor-netnstest-internet.lock"

// NewInternet makes the test internet, removed when tb ends (one at a
// time on a host: a second waits for the first to end).
func NewInternet(tb testing.TB) Internet {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Fatal("netnstest: needs root (network namespaces)")
	}
	lockInternet(tb)
	removeStale(tb)
	third, fourth := rand.IntN(256), 4*rand.IntN(64)
	tag := fmt.Sprintf("%02x%02x", third, fourth)
	in := Internet{
		Ranges: freeRanges(tb, documentation),
		NodeIP: fmt.Sprintf("198.18.%d.%d", third, fourth+1), IP: fmt.Sprintf("198.18.%d.%d", third, fourth+2),
		TCPPorts: InternetTCPPorts, UDPPorts: InternetUDPPorts,
		NS: internetNS + tag,
	}
	hostLink := internetLink + tag
	ns := linkedNS(tb, in.NS, hostLink, in.NodeIP, func() { removeInternet(hostLink, in.NS) })
	defer ns.Close()
	link, err := netlink.LinkByName(hostLink)
	if err != nil {
		tb.Fatal(err)
	}
	for _, p := range in.Ranges {
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}, Gw: net.ParseIP(in.IP)}
		// Added, never replaced: a route of the host's own stays.
		if err := netlink.RouteAdd(r); err != nil {
			tb.Fatalf("test internet: route %s: %v", p, err)
		}
	}
	// The sockets are made in the namespace and served from anywhere.
	var tcp []net.Listener
	var udp []net.PacketConn
	err = inNS(ns, func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer h.Close()
		if err := up("eth0", in.IP); err != nil {
			return err
		}
		if err := up("lo", ""); err != nil {
			return err
		}
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, p := range in.Ranges {
			// An address of a /24 on lo makes the whole /24 local.
			a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().Next().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}}
			if err := h.AddrAdd(lo, a); err != nil {
				return fmt.Errorf("lo: %s: %w", a.IPNet, err)
			}
		}
		if err := h.RouteReplace(&netlink.Route{Gw: net.ParseIP(in.NodeIP)}); err != nil {
			return fmt.Errorf("default route: %w", err)
		}
		for _, port := range in.TCPPorts {
			l, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port))
			if err != nil {
				return err
			}
			tcp = append(tcp, l)
		}
		for _, port := range in.UDPPorts {
			c, err := net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", port))
			if err != nil {
				return err
			}
			udp = append(udp, c)
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("test internet: %v", err)
	}
	for _, l := range tcp {
		tb.Cleanup(func() { l.Close() })
		go answerFrom(l)
	}
	for _, c := range udp {
		tb.Cleanup(func() { c.Close() })
		// Answered from the address asked, as the sender's connection
		// tracking expects (the socket listens on all of them).
		pc := ipv4.NewPacketConn(c)
		if err := pc.SetControlMessage(ipv4.FlagDst, true); err != nil {
			tb.Fatal(err)
		}
		go func() {
			buf := make([]byte, 1500)
			for {
				_, cm, addr, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				from, _, _ := net.SplitHostPort(addr.String())
				var reply *ipv4.ControlMessage
				if cm != nil {
					reply = &ipv4.ControlMessage{Src: cm.Dst}
				}
				pc.WriteTo([]byte(from+"\n"), reply, addr) //nolint:errcheck // the sender retries
			}
		}()
	}
	return in
}

// lockInternet holds lockPath until tb ends. The lock is the open file's:
// a second one in the same process waits too.
func lockInternet(tb testing.TB) {
	tb.Helper()
	lock, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { lock.Close() })
}

// The names an Internet's host link and namespace start with.
const (
	internetLink = "tpinet"
	internetNS   = "/var/run/netns/tp-internet-"
)

// removeInternet removes an Internet's link (its routes go with it, and
// the namespace takes the link's other end along) and its namespace.
func removeInternet(hostLink, nsPath string) {
	if l, err := netlink.LinkByName(hostLink); err == nil {
		netlink.LinkDel(l) //nolint:errcheck // best effort
	}
	removeNS(nsPath)
}

func removeNS(nsPath string) {
	unix.Unmount(nsPath, unix.MNT_DETACH) //nolint:errcheck // may not be mounted
	os.Remove(nsPath)
}

// removeStale removes what a killed test's Internet left: its link kept
// its routes to the documentation ranges, which a new one would find
// taken. The caller holds lockPath, so no live Internet is on the host:
// every link and namespace by an Internet's name is a dead process's.
func removeStale(tb testing.TB) {
	tb.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		tb.Fatalf("test internet: links: %v", err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, internetLink) {
			netlink.LinkDel(l) //nolint:errcheck // best effort: a route left makes NewInternet fail, naming it
		}
	}
	stale, err := filepath.Glob(internetNS + "*")
	if err != nil {
		tb.Fatal(err)
	}
	for _, nsPath := range stale {
		removeNS(nsPath)
	}
}

// inNS runs fn on a thread in ns; the thread is discarded after.
func inNS(ns netns.NsHandle, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread leaves with the goroutine
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return <-done
}

// InNS runs fn on a thread in the network namespace at path: a test's
// client in a slot's namespace.
func InNS(path string, fn func() error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	return inNS(ns, fn)
}

// documentation are the ranges RFC 5737 reserves for documentation.
var documentation = []netip.Prefix{
	netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("203.0.113.0/24"),
}

// freeRanges are those of ranges no route of this host (but a default
// one) overlaps; at least two, or tb fails.
func freeRanges(tb testing.TB, ranges []netip.Prefix) []netip.Prefix {
	tb.Helper()
	routes, err := netlink.RouteList(nil, unix.AF_INET)
	if err != nil {
		tb.Fatal(err)
	}
	var free []netip.Prefix
	for _, p := range ranges {
		taken := false
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			bits, _ := r.Dst.Mask.Size()
			if rp, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && (bits > 0 && netip.PrefixFrom(rp, bits).Overlaps(p)) {
				taken = true
			}
		}
		if !taken {
			free = append(free, p)
		}
	}
	if len(free) < 2 {
		tb.Fatalf("test internet: this host routes all but %v of the documentation ranges %v already", free, ranges)
	}
	return free
}

// Addr is address host (the last byte) of the internet's i-th range.
func (in Internet) Addr(i, host int) netip.Addr {
	b := in.Ranges[i].Addr().As4()
	b[3] = byte(host)
	return netip.AddrFrom4(b)
}

// AddrPort is Addr and port as "ip:port".
func (in Internet) AddrPort(i, host, port int) string {
	return netip.AddrPortFrom(in.Addr(i, host), uint16(port)).String()
}
