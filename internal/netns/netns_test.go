package netns

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	egresspolicy "github.com/torpor-dev/torpor/internal/egress"
	"github.com/torpor-dev/torpor/internal/netns/netnstest"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

func TestNewValidates(t *testing.T) {
	cases := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"defaults", Config{Node: "n1"}, ""},
		{"no node", Config{}, "node: empty"},
		{"node with slash", Config{Node: "a/b"}, "node: \"a/b\""},
		{"long bridge", Config{Node: "n", Bridge: "a-very-long-bridge"}, "bridge"},
		{"bad cidr", Config{Node: "n", CIDR: "10.0.0.0"}, "cidr"},
		{"ipv6", Config{Node: "n", CIDR: "fd00::/64"}, "IPv4"},
		{"too small", Config{Node: "n", CIDR: "10.0.0.0/31"}, "at least 4"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("New(%+v) = %v", tc.cfg, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("New(%+v) = %v, want an error containing %q", tc.cfg, err, tc.wantErr)
			}
		})
	}
}

func TestIP(t *testing.T) {
	n, err := New(Config{Node: "n", CIDR: "10.9.8.77/24"})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Gateway().String(); got != "10.9.8.1" {
		t.Errorf("gateway = %s, want 10.9.8.1", got)
	}
	cases := []struct {
		index int
		want  string // empty: out of range
	}{
		{0, "10.9.8.2"},
		{1, "10.9.8.3"},
		{252, "10.9.8.254"},
		{253, ""},
		{-1, ""},
	}
	for _, tc := range cases {
		ip, err := n.IP(tc.index)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("IP(%d) = %s, want an out-of-range error", tc.index, ip)
		case tc.want != "" && (err != nil || ip.String() != tc.want):
			t.Errorf("IP(%d) = %s, %v; want %s", tc.index, ip, err, tc.want)
		}
	}
}

func TestNamesStayWithinLimits(t *testing.T) {
	n, err := New(Config{Node: strings.Repeat("x", 200), CIDR: "10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.IP(maxSlots); err == nil {
		t.Errorf("IP(%d) allowed; host link names would get too long", maxSlots)
	}
	if l := n.hostLink(maxSlots - 1); len(l) > 15 {
		t.Errorf("host link name %q is %d bytes, the kernel allows 15", l, len(l))
	}
	other, _ := New(Config{Node: "other", CIDR: "10.0.0.0/8"})
	if n.nsName(1) == other.nsName(1) || n.hostLink(1) == other.hostLink(1) {
		t.Errorf("two nodes share names: %s/%s", n.nsName(1), n.hostLink(1))
	}
}

// testNetwork makes a network with its own bridge and subnet (distinct from
// other packages' tests) and removes it, and leftovers of crashed runs, at
// both ends of the test.
func testNetwork(t *testing.T) *Network { return testNetworkWith(t, false) }

func testNetworkWith(t testing.TB, egress bool) *Network {
	t.Helper()
	runtimetest.RequireRoot(t)
	n, err := New(Config{Node: "netnstest", Bridge: "tpnetnstest", CIDR: "10.252.0.0/24", Egress: egress})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := n.TeardownAll(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.TeardownAll(ctx); err != nil {
			t.Error(err)
		}
		assertNothingLeft(t, n)
	})
	return n
}

// inNS runs fn on a thread in the namespace at nsPath.
func inNS(t *testing.T, nsPath string, fn func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread dies with the goroutine instead of
		// going back to the pool inside the namespace.
		goruntime.LockOSThread()
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		fn()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatalf("enter %s: %v", nsPath, err)
	}
}

func assertNothingLeft(t testing.TB, n *Network) {
	t.Helper()
	entries, _ := os.ReadDir(Dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "torpor-"+n.node+"-") {
			t.Errorf("namespace %s left behind", e.Name())
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if name := l.Attrs().Name; strings.HasPrefix(name, n.linkTag) || name == n.bridge {
			t.Errorf("link %s left behind", name)
		}
	}
	if c, err := nftables.New(); err == nil {
		if _, err := c.ListTableOfFamily(n.table().Name, nftables.TableFamilyIPv4); err == nil {
			t.Errorf("nftables table %s left behind", n.table().Name)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), "torpor-"+n.node+"-") {
		t.Errorf("namespace mounts left behind")
	}
}

// serveIn listens on port inside the namespace at nsPath and answers every
// connection with reply.
func serveIn(t *testing.T, nsPath string, port int, reply string) {
	t.Helper()
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread dies with the goroutine instead of
		// going back to the pool inside the namespace.
		goruntime.LockOSThread()
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			ch <- result{err: err}
			return
		}
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		ch <- result{l, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listen in %s: %v", nsPath, r.err)
	}
	t.Cleanup(func() { r.l.Close() })
	go func() {
		for {
			c, err := r.l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, reply)
			c.Close()
		}
	}()
}

func dial(ip string, port int) (string, error) {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, fmt.Sprint(port)), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestSlotsAreReachableOnTheSamePort(t *testing.T) {
	n := testNetwork(t)
	ctx := context.Background()
	const port = 18080
	for i := range 2 {
		s, err := n.Slot(ctx, fmt.Sprintf("w%d", i), i)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("10.252.0.%d", i+2)
		if s.IP != want || s.Gateway != "10.252.0.1" || s.PrefixLen != 24 || s.NetNS != filepath.Join(Dir, fmt.Sprintf("torpor-netnstest-%d", i)) {
			t.Fatalf("slot %d = %+v, want ip %s via 10.252.0.1/24", i, s, want)
		}
		serveIn(t, s.NetNS, port, fmt.Sprintf("slot %d", i))
	}
	for i := range 2 {
		got, err := dial(fmt.Sprintf("10.252.0.%d", i+2), port)
		if err != nil || got != fmt.Sprintf("slot %d", i) {
			t.Errorf("slot %d answered %q, %v", i, got, err)
		}
	}
}

func TestSlotKeepsALiveNamespaceAndRepairsABrokenOne(t *testing.T) {
	n := testNetwork(t)
	ctx := context.Background()
	s, err := n.Slot(ctx, "w0", 0)
	if err != nil {
		t.Fatal(err)
	}
	ino := nsInode(t, s.NetNS)

	// A sandbox runtime takes the address off the guest interface; a node
	// agent restarting then must not rebuild the namespace under it.
	ns, _ := netns.GetFromPath(s.NetNS)
	h, err := netlink.NewHandleAt(ns)
	ns.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName(guestLink)
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := h.AddrList(eth, netlink.FAMILY_V4)
	for _, a := range addrs {
		if err := h.AddrDel(eth, &a); err != nil {
			t.Fatal(err)
		}
	}
	again, err := n.Slot(ctx, "w0", 0)
	if err != nil || again != s {
		t.Fatalf("Slot again = %+v, %v; want %+v", again, err, s)
	}
	if nsInode(t, s.NetNS) != ino {
		t.Fatal("Slot replaced an intact namespace")
	}
	if addrs, _ := h.AddrList(eth, netlink.FAMILY_V4); len(addrs) != 0 {
		t.Fatalf("Slot put an address back under a (possibly) live sandbox: %v", addrs)
	}
	if err := Configure(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := Configure(ctx, s); err != nil {
		t.Fatalf("Configure is not idempotent: %v", err)
	}
	serveIn(t, s.NetNS, 18081, "configured")
	if got, err := dial(s.IP, 18081); err != nil || got != "configured" {
		t.Fatalf("after Configure: %q, %v", got, err)
	}

	// Losing the veth breaks the slot: Slot rebuilds it.
	link, err := netlink.LinkByName(n.hostLink(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(link); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Slot(ctx, "w0", 0); err != nil {
		t.Fatal(err)
	}
	serveIn(t, s.NetNS, 18082, "rebuilt")
	if got, err := dial(s.IP, 18082); err != nil || got != "rebuilt" {
		t.Fatalf("after rebuild: %q, %v", got, err)
	}
}

func TestTeardownIsIdempotent(t *testing.T) {
	n := testNetwork(t)
	ctx := context.Background()
	for i := range 2 {
		if _, err := n.Slot(ctx, fmt.Sprintf("w%d", i), i); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := n.Teardown(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(n.nsPath(0)); !os.IsNotExist(err) {
		t.Errorf("namespace of slot 0 still there: %v", err)
	}
	if _, err := netlink.LinkByName(n.hostLink(0)); err == nil {
		t.Error("veth of slot 0 still there")
	}
	if !n.intact(1) {
		t.Error("tearing down slot 0 damaged slot 1")
	}
	if err := n.TeardownAll(ctx); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, n)
	if err := n.TeardownAll(ctx); err != nil {
		t.Fatalf("TeardownAll on nothing: %v", err)
	}
}

// TestWorkloadsCannotReachEachOther: the node reaches every slot, a slot
// reaches the node, but no slot reaches another.
func TestWorkloadsCannotReachEachOther(t *testing.T) {
	n := testNetwork(t)
	ctx := context.Background()
	const port = 18081
	var slots []string
	for i := range 2 {
		s, err := n.Slot(ctx, fmt.Sprintf("w%d", i), i)
		if err != nil {
			t.Fatal(err)
		}
		serveIn(t, s.NetNS, port, fmt.Sprintf("slot %d", i))
		slots = append(slots, s.NetNS)
	}
	if got, err := dial("10.252.0.3", port); err != nil || got != "slot 1" {
		t.Fatalf("the node dials slot 1: %q, %v", got, err)
	}
	ln, err := net.Listen("tcp", "10.252.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	netnstest.ServeLine(t, ln, "node")
	// Even a slot allowed everything public (policy.go).
	if err := n.ApplyPolicy(ctx, 0, egresspolicy.Policy{Mode: egresspolicy.Allow}); err != nil {
		t.Fatal(err)
	}
	inNS(t, slots[0], func() {
		if got, err := dial("10.252.0.1", ln.Addr().(*net.TCPAddr).Port); err == nil {
			t.Errorf("slot 0 reached the node (%q): a slot reaches the node's resolver only", got)
		}
		if got, err := dial("10.252.0.3", port); err == nil {
			t.Errorf("slot 0 reached slot 1 (%q): bridge ports are not isolated", got)
		}
	})
}

// TestEgress: with Egress a workload reaches a host beyond the node (here
// a namespace the test wires to the node with a veth), which sees the
// node's address; without it the connection fails.
func TestEgress(t *testing.T) {
	outside := netnstest.Outside(t)
	for _, egress := range []bool{false, true} {
		t.Run(fmt.Sprintf("egress=%v", egress), func(t *testing.T) {
			n := testNetworkWith(t, egress)
			s, err := n.Slot(context.Background(), "w0", 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := n.ApplyPolicy(context.Background(), 0, egresspolicy.Policy{Mode: egresspolicy.Allow}); err != nil {
				t.Fatal(err)
			}
			inNS(t, s.NetNS, func() {
				got, err := dial(outside.IP, outside.Port)
				switch {
				case egress && (err != nil || got != outside.NodeIP):
					t.Errorf("dial %s from the slot: %q, %v; want to be seen as the node, %s", outside.IP, got, err, outside.NodeIP)
				case !egress && err == nil:
					t.Errorf("dial %s from the slot without egress reached it (%q)", outside.IP, got)
				}
			})
		})
	}
}

// TestRemoveAllSaysWhatItRemoved: what `torpor node --cleanup` prints.
func TestRemoveAllSaysWhatItRemoved(t *testing.T) {
	n := testNetworkWith(t, true)
	ctx := context.Background()
	for i := range 2 {
		if _, err := n.Slot(ctx, fmt.Sprintf("w%d", i), i); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := n.RemoveAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{
		"bridge tpnetnstest",
		"network namespace " + n.nsPath(0), "network namespace " + n.nsPath(1),
		"nftables table ip torpor-tpnetnstest",
		"veth " + n.hostLink(0), "veth " + n.hostLink(1),
	}
	if !slices.Equal(removed, want) {
		t.Errorf("RemoveAll removed %q, want %q", removed, want)
	}
	assertNothingLeft(t, n)
	if removed, err := n.RemoveAll(ctx); err != nil || len(removed) > 0 {
		t.Errorf("RemoveAll on nothing: %q, %v", removed, err)
	}
}

// TestWorkersAreReachableFromTheHostOnly: a host that routes to the
// workers' subnet through the node (here the outside namespace, given
// that route) reaches the node but no worker; the node itself does. With
// the firewall chain removed the same dial gets through, so the refusal is
// the firewall's.
func TestWorkersAreReachableFromTheHostOnly(t *testing.T) {
	outside := netnstest.Outside(t)
	n := testNetworkWith(t, true) // egress turns forwarding on
	ctx := context.Background()
	s, err := n.Slot(ctx, "w0", 0)
	if err != nil {
		t.Fatal(err)
	}
	const port = 18083
	serveIn(t, s.NetNS, port, "worker")
	if got, err := dial(s.IP, port); err != nil || got != "worker" {
		t.Fatalf("the node dials the worker: %q, %v", got, err)
	}
	fromOutside := func() (string, error) {
		var got string
		var err error
		inNS(t, outside.NS, func() {
			h, herr := netlink.NewHandle()
			if herr != nil {
				err = herr
				return
			}
			defer h.Close()
			_, subnet, _ := net.ParseCIDR("10.252.0.0/24")
			if herr := h.RouteReplace(&netlink.Route{Dst: subnet, Gw: net.ParseIP(outside.NodeIP)}); herr != nil {
				err = herr
				return
			}
			got, err = dial(s.IP, port)
		})
		return got, err
	}
	if got, err := fromOutside(); err == nil {
		t.Fatalf("a host beyond the node reached the worker (%q)", got)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	c.DelChain(&nftables.Chain{Name: firewallChain, Table: n.table()})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if got, err := fromOutside(); err != nil || got != "worker" {
		t.Fatalf("without the firewall chain, the outside host dials the worker: %q, %v; the refusal above proves nothing", got, err)
	}
	// Slot (every start) puts the rule back.
	if _, err := n.Slot(ctx, "w0", 0); err != nil {
		t.Fatal(err)
	}
	if got, err := fromOutside(); err == nil {
		t.Fatalf("after Slot, a host beyond the node reached the worker (%q)", got)
	}
}
