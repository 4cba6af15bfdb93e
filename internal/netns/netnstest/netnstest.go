// Package netnstest makes a host "beyond the node" for tests of workload
// egress: a network namespace wired to the host by a veth, with no route
// to any worker subnet.
package netnstest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Host is the outside host: it listens on IP:Port and answers each
// connection with the address it came from. NodeIP is the host's end of
// the link, what a masqueraded workload is seen as.
type Host struct {
	IP, NodeIP string
	Port       int
	// NS is the path of its network namespace.
	NS string
}

// Addr is IP:Port.
func (h Host) Addr() string { return net.JoinHostPort(h.IP, fmt.Sprint(h.Port)) }

// Outside makes the outside host (198.18.X.Y+2, linked to 198.18.X.Y+1 on
// this host, with X and Y drawn at random so that tests in several
// processes at once do not meet), removed when tb ends.
func Outside(tb testing.TB) Host {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Fatal("netnstest: needs root (network namespaces)")
	}
	third, fourth := rand.IntN(256), 4*rand.IntN(64)
	tag := fmt.Sprintf("%02x%02x", third, fourth)
	nsPath, hostLink := "/var/run/netns/tp-outside-"+tag, "tpout"+tag
	removeOutside := func() {
		if l, err := netlink.LinkByName(hostLink); err == nil {
			netlink.LinkDel(l) //nolint:errcheck // best effort; the namespace takes its end along
		}
		unix.Unmount(nsPath, unix.MNT_DETACH) //nolint:errcheck // may not be mounted
		os.Remove(nsPath)
	}
	removeOutside()
	h := Host{IP: fmt.Sprintf("198.18.%d.%d", third, fourth+2), NodeIP: fmt.Sprintf("198.18.%d.%d", third, fourth+1), Port: 18082, NS: nsPath}
	ns := linkedNS(tb, nsPath, hostLink, h.NodeIP, removeOutside)
	defer ns.Close()
	listening := make(chan error, 1)
	go func() {
		// Never unlocked: the thread dies with the goroutine instead of
		// going back to the pool inside the namespace.
		goruntime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			listening <- err
			return
		}
		if err := up("lo", ""); err != nil {
			listening <- err
			return
		}
		if err := up("eth0", h.IP); err != nil {
			listening <- err
			return
		}
		l, err := net.Listen("tcp", h.Addr())
		listening <- err
		if err != nil {
			return
		}
		tb.Cleanup(func() { l.Close() })
		answerFrom(l)
	}()
	if err := <-listening; err != nil {
		tb.Fatalf("outside host: %v", err)
	}
	return h
}

// up brings link up, with ip/30 when ip is set, in the namespace of the
// calling thread.
func up(link, ip string) error {
	h, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(link)
	if err != nil {
		return fmt.Errorf("%s: %w", link, err)
	}
	if ip != "" {
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(ip), Mask: net.CIDRMask(30, 32)}}); err != nil {
			return fmt.Errorf("%s: address %s: %w", link, ip, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s: up: %w", link, err)
	}
	return nil
}

// newNamedNS creates a network namespace and bind-mounts it at nsPath,
// without entering it.
func newNamedNS(nsPath string) (netns.NsHandle, error) {
	f, err := os.Create(nsPath)
	if err != nil {
		return 0, err
	}
	f.Close()
	result := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread leaves with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			result <- err
			return
		}
		result <- unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), nsPath, "", unix.MS_BIND, "")
	}()
	if err := <-result; err != nil {
		os.Remove(nsPath)
		return 0, fmt.Errorf("outside namespace: %w", err)
	}
	return netns.GetFromPath(nsPath)
}

// linkedNS makes a namespace at nsPath with a veth to this host (hostLink,
// with nodeIP/30 here, eth0 there), removed by remove when tb ends.
func linkedNS(tb testing.TB, nsPath, hostLink, nodeIP string, remove func()) netns.NsHandle {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(nsPath), 0o755); err != nil {
		tb.Fatal(err)
	}
	ns, err := newNamedNS(nsPath)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(remove)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostLink}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		ns.Close()
		tb.Fatal(err)
	}
	if err := up(hostLink, nodeIP); err != nil {
		ns.Close()
		tb.Fatal(err)
	}
	return ns
}

// ServeLine answers every connection ln accepts with line, until tb
// ends.
func ServeLine(tb testing.TB, ln net.Listener, line string) {
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, line)
			c.Close()
		}
	}()
}

// answerFrom answers every connection l accepts with the address it came
// from, until l is closed.
func answerFrom(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		from, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		fmt.Fprintln(c, from)
		c.Close()
	}
}
