package netnstest

import (
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestNewInternetAfterAKilledRun: a run killed before its cleanup leaves
// its namespace and its link with routes to documentation ranges; the
// next NewInternet removes them and holds every range it would have held
// without them.
func TestNewInternetAfterAKilledRun(t *testing.T) {
	const staleLink, staleNS = internetLink + "dead", internetNS + "dead"
	var free []netip.Prefix
	t.Run("killed", func(t *testing.T) {
		// What NewInternet had made when its process was killed (no
		// cleanup runs), under the lock: another process's internet
		// takes the routes too.
		lockInternet(t)
		removeStale(t)
		free = freeRanges(t, documentation)
		ns := linkedNS(t, staleNS, staleLink, "198.18.255.253", func() {})
		ns.Close()
		link, err := netlink.LinkByName(staleLink)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range free {
			r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}, Gw: net.ParseIP("198.18.255.254")}
			if err := netlink.RouteAdd(r); err != nil {
				t.Fatalf("stale route %s: %v", p, err)
			}
		}
	})

	in := NewInternet(t)
	if len(in.Ranges) != len(free) {
		t.Errorf("the internet after a killed run holds %v, want %v", in.Ranges, free)
	}
	if _, err := netlink.LinkByName(staleLink); err == nil {
		t.Errorf("the killed run's link %s is left", staleLink)
	}
	if _, err := os.Stat(staleNS); !os.IsNotExist(err) {
		t.Errorf("the killed run's namespace %s is left (stat: %v)", staleNS, err)
	}
}
