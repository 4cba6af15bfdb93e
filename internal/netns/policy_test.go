package netns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
	"github.com/torpor-dev/torpor/internal/netns/netnstest"
)

func mustPolicy(t *testing.T, p *torporv1.EgressPolicy) egress.Policy {
	t.Helper()
	out, err := egress.Parse(p, "egress")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// udpEcho sends one datagram to addr and reads the answer.
func udpEcho(addr string) (string, error) {
	c, err := net.Dial("udp4", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return "", err
	}
	buf := make([]byte, 100)
	n, err := c.Read(buf)
	return strings.TrimSpace(string(buf[:n])), err
}

// TestSlotPolicy: what a slot reaches under each mode, from its own
// namespace (the kernel's stack: the same packets a sandbox sends), and
// that a refusal is counted and rejected at once, not dropped.
func TestSlotPolicy(t *testing.T) {
	in := netnstest.NewInternet(t)
	n := testNetworkWith(t, true)
	ctx := context.Background()
	s, err := n.Slot(ctx, "w0", 0)
	if err != nil {
		t.Fatal(err)
	}
	// Something of the node's listening on every address.
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	netnstest.ServeLine(t, ln, "node")
	nodePort := ln.Addr().(*net.TCPAddr).Port
	logged := make(chan Refused, 100)
	readCtx, stopReading := context.WithCancel(ctx)
	readErr := make(chan error, 1)
	go func() { readErr <- n.Refusals(readCtx, func(r Refused) { logged <- r }) }()
	defer func() {
		stopReading()
		if err := <-readErr; err != nil {
			t.Errorf("Refusals: %v", err)
		}
	}()
	self := in.NodeIP // our address
	type probe struct {
		name  string
		udp   bool
		addr  string
		reach bool
	}
	tcp := func(ip string, port int) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }
	run := func(t *testing.T, probes []probe) {
		t.Helper()
		if _, err := n.Denied(ctx, 0); err != nil {
			t.Fatal(err)
		}
		refused := 0
		netnstest.InNS(s.NetNS, func() error {
			for _, p := range probes {
				began := time.Now()
				var got string
				var err error
				if p.udp {
					got, err = udpEcho(p.addr)
				} else {
					got, err = dial(strings.Split(p.addr, ":")[0], mustPort(p.addr))
				}
				switch {
				case p.reach && err != nil:
					t.Errorf("%s (%s): %v, want it reached", p.name, p.addr, err)
				case !p.reach && err == nil:
					t.Errorf("%s (%s): reached (%q), want it refused", p.name, p.addr, got)
				case !p.reach && !p.udp && !strings.Contains(err.Error(), "refused"):
					t.Errorf("%s (%s): %v after %s, want it refused (a reset), not dropped", p.name, p.addr, err, time.Since(began))
				}
				if !p.reach {
					refused++
				}
			}
			return nil
		})
		denied, err := n.Denied(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if int(denied) < refused {
			t.Errorf("counted %d refusals, want at least %d", denied, refused)
		}
	}
	t.Run("deny", func(t *testing.T) {
		if err := n.ApplyPolicy(ctx, 0, egress.Policy{Mode: egress.Deny}); err != nil {
			t.Fatal(err)
		}
		run(t, []probe{
			{"public tcp", false, in.AddrPort(0, 7, 443), false},
			{"public udp", true, in.AddrPort(0, 7, 443), false},
			{"gateway", false, tcp(n.Gateway().String(), nodePort), false},
			{"the node's link", false, tcp(self, nodePort), false},
		})
	})
	t.Run("allow", func(t *testing.T) {
		if err := n.ApplyPolicy(ctx, 0, egress.Policy{Mode: egress.Allow}); err != nil {
			t.Fatal(err)
		}
		run(t, []probe{
			{"public tcp", false, in.AddrPort(0, 7, 443), true},
			{"public udp", true, in.AddrPort(1, 9, 9000), true},
			{"gateway", false, tcp(n.Gateway().String(), nodePort), false},
			{"the node's link", false, tcp(self, nodePort), false},
			{"metadata", false, tcp("169.254.169.254", 80), false},
		})
	})
	t.Run("allowlist", func(t *testing.T) {
		p := mustPolicy(t, &torporv1.EgressPolicy{Rules: []*torporv1.EgressRule{
			{Cidr: in.Ranges[0].String(), Ports: []string{"443"}},
			{Host: "api.example.test", Ports: []string{"8443", "9000-9001"}},
			{Cidr: "0.0.0.0/0", Protocol: torporv1.EgressProtocol_EGRESS_PROTOCOL_UDP, Ports: []string{"9000"}},
		}})
		if err := n.ApplyPolicy(ctx, 0, p); err != nil {
			t.Fatal(err)
		}
		run(t, []probe{
			{"address rule", false, in.AddrPort(0, 7, 443), true},
			{"address rule, other port", false, in.AddrPort(0, 7, 8443), false},
			{"host rule before an answer", false, in.AddrPort(1, 20, 8443), false},
			{"udp rule", true, in.AddrPort(1, 9, 9000), true},
			{"udp, other port", true, in.AddrPort(1, 9, 443), false},
			{"0.0.0.0/0 does not reach the node", false, tcp(n.Gateway().String(), nodePort), false},
			{"nor its link", false, tcp(self, nodePort), false},
		})
		if err := n.Permit(ctx, 0, 1, []netip.Addr{in.Addr(1, 20)}, time.Minute); err != nil {
			t.Fatal(err)
		}
		want := Refused{Src: netip.MustParseAddr("10.252.0.2"), Dst: in.Addr(0, 7), Protocol: 6, Port: 8443}
		for r := range logged {
			if r.Src == want.Src && r.Dst == want.Dst && r.Protocol == want.Protocol && r.Port == want.Port {
				break
			}
		}
		run(t, []probe{
			{"host rule, answered", false, in.AddrPort(1, 20, 8443), true},
			{"host rule, answered, other port", false, in.AddrPort(1, 20, 443), false},
			{"another address", false, in.AddrPort(1, 21, 8443), false},
		})
	})
	t.Run("a protected address named", func(t *testing.T) {
		// What an administrator names explicitly is reached: here one
		// of the node's own addresses, on one port.
		p := mustPolicy(t, &torporv1.EgressPolicy{Rules: []*torporv1.EgressRule{
			{Cidr: self + "/32", Ports: []string{fmt.Sprint(nodePort)}},
		}})
		if err := n.ApplyPolicy(ctx, 0, p); err != nil {
			t.Fatal(err)
		}
		run(t, []probe{
			{"the node's link, named", false, tcp(self, nodePort), true},
			{"the gateway, not named", false, tcp(n.Gateway().String(), nodePort), false},
		})
	})
	t.Run("dns goes to the gateway", func(t *testing.T) {
		pc, err := net.ListenPacket("udp4", net.JoinHostPort(n.Gateway().String(), "53"))
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		go func() {
			buf := make([]byte, 100)
			for {
				_, addr, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo([]byte("resolver\n"), addr)
			}
		}()
		netnstest.InNS(s.NetNS, func() error {
			if got, err := udpEcho(in.AddrPort(1, 53, 53)); err != nil || got != "resolver" {
				t.Errorf("a query to another nameserver: %q, %v; want the node's resolver", got, err)
			}
			return nil
		})
	})
	t.Run("cleared", func(t *testing.T) {
		if _, err := n.ClearPolicy(ctx, 0); err != nil {
			t.Fatal(err)
		}
		netnstest.InNS(s.NetNS, func() error {
			if got, err := dial(in.Addr(0, 7).String(), 443); err == nil {
				t.Errorf("a slot without a policy reached %q", got)
			}
			return nil
		})
		c, _ := nftables.New()
		chains, _ := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
		for _, ch := range chains {
			if ch.Table.Name == n.table().Name && strings.HasPrefix(ch.Name, "slot-") {
				t.Errorf("chain %s left after ClearPolicy", ch.Name)
			}
		}
		sets, _ := c.GetSets(n.table())
		for _, st := range sets {
			if strings.HasPrefix(st.Name, "slot-") {
				t.Errorf("set %s left after ClearPolicy", st.Name)
			}
		}
		if _, err := n.ClearPolicy(ctx, 0); err != nil {
			t.Errorf("ClearPolicy again: %v", err)
		}
	})
}

func mustPort(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	var port int
	fmt.Sscan(p, &port)
	return port
}

// TestApplyPolicyOfMaxRules: the largest policy a template may have is
// written in one batch (the kernel's acknowledgements of it overflowed
// netlink's default buffer at some fifty rules).
func TestApplyPolicyOfMaxRules(t *testing.T) {
	n := testNetworkWith(t, true)
	ctx := context.Background()
	if _, err := n.Slot(ctx, "w0", 0); err != nil {
		t.Fatal(err)
	}
	var rules []*torporv1.EgressRule
	for i := range egress.MaxRules {
		if i%2 == 0 {
			rules = append(rules, &torporv1.EgressRule{Cidr: fmt.Sprintf("198.18.%d.%d/32", i/256, i%256), Ports: []string{"443", "8000-8999"}})
		} else {
			rules = append(rules, &torporv1.EgressRule{Host: fmt.Sprintf("h%d.example.com", i), Ports: []string{"443"}})
		}
	}
	if err := n.ApplyPolicy(ctx, 0, mustPolicy(t, &torporv1.EgressPolicy{Rules: rules})); err != nil {
		t.Fatalf("ApplyPolicy of %d rules: %v", len(rules), err)
	}
	if _, err := n.ClearPolicy(ctx, 0); err != nil {
		t.Fatal(err)
	}
}
