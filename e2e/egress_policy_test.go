package e2e

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/netns/netnstest"
)

// egressProbe is one attempt from inside a sandbox: the counter's /dial
// (net tcp, udp or icmp) or /resolve, and whether it must get through.
type egressProbe struct {
	name  string
	path  string
	reach bool
	// counted: a refusal the node counts (one that never leaves the
	// sandbox, IPv6, is not).
	counted bool
}

func dialPath(network, addr string) string {
	return "/dial?net=" + network + "&addr=" + url.QueryEscape(addr)
}

// TestEgressPolicy: actors under deny, allow and an allowlist, on real
// gVisor, against a test internet (the documentation ranges, in a
// namespace routed from the host): what each reaches, and that each
// refusal is counted for its actor.
func TestEgressPolicy(t *testing.T) {
	in := netnstest.NewInternet(t)
	upstream := netnstest.DNS(t, map[string][]netip.Addr{
		"api.example.test":      {in.Addr(1, 30)},
		"other.example.test":    {in.Addr(1, 31)},
		"pinned.example.test":   {in.Addr(1, 33)},
		"inside.example.test":   {netip.MustParseAddr("10.0.0.5")},
		"metadata.example.test": {netip.MustParseAddr("169.254.169.254")},
	})
	c := newCluster(t, clusterOptions{backend: "sqlite", egress: true, workersPerNode: 3, dns: []string{upstream}})
	// Something of the node's, listening on all its addresses.
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	netnstest.ServeLine(t, ln, "node")
	nodePort := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	gateway := c.nodes[0].network.Gateway().String()
	policies := map[string]*torporv1.EgressPolicy{
		"deny":  {Mode: torporv1.EgressMode_EGRESS_MODE_DENY},
		"allow": {Mode: torporv1.EgressMode_EGRESS_MODE_ALLOW},
		"list": {Mode: torporv1.EgressMode_EGRESS_MODE_ALLOWLIST, Rules: []*torporv1.EgressRule{
			{Cidr: in.Ranges[0].String(), Ports: []string{"443"}},
			{Cidr: in.Ranges[1].String(), Protocol: torporv1.EgressProtocol_EGRESS_PROTOCOL_UDP, Ports: []string{"9000"}},
			{Cidr: "0.0.0.0/0", Ports: []string{"9000"}},
			{Host: "api.example.test", Ports: []string{"443"}},
			{Host: "pinned.example.test", Ports: []string{"443"}},
			{Host: "inside.example.test", Ports: []string{"443"}},
			{Host: "metadata.example.test", Ports: []string{"80"}},
		}},
	}
	for name, p := range policies {
		c.applyTemplate(counterTemplate(t, "egress-"+name, func(s *torporv1.TemplateSpec) { s.Egress = p }))
		c.createActor(name, "egress-"+name)
	}
	// Shared by every policy: never reachable.
	never := []egressProbe{
		{"the gateway, on a port the node listens on", dialPath("tcp", net.JoinHostPort(gateway, nodePort)), false, true},
		{"the node's test link", dialPath("tcp", net.JoinHostPort(in.NodeIP, nodePort)), false, true},
		{"cloud metadata", dialPath("tcp", "169.254.169.254:80"), false, true},
		{"a private address", dialPath("tcp", "10.0.0.5:443"), false, true},
		{"IPv6", dialPath("tcp", "[2001:db8::1]:443"), false, false},
	}
	probes := map[string][]egressProbe{
		"deny": append([]egressProbe{
			{"a name", "/resolve?name=api.example.test", false, true},
			{"tcp", dialPath("tcp", in.AddrPort(0, 10, 443)), false, true},
			{"udp", dialPath("udp", in.AddrPort(1, 10, 9000)), false, true},
			{"icmp", dialPath("icmp", in.Addr(1, 11).String()), false, true},
		}, never...),
		"allow": append([]egressProbe{
			{"any name", "/resolve?name=other.example.test", true, false},
			{"any name, connected", dialPath("tcp", "other.example.test:8443"), true, false},
			{"tcp", dialPath("tcp", in.AddrPort(0, 10, 443)), true, false},
			{"udp", dialPath("udp", in.AddrPort(1, 10, 9000)), true, false},
			{"another port", dialPath("tcp", in.AddrPort(1, 11, 8443)), true, false},
		}, never...),
		"list": append([]egressProbe{
			{"an allowed name", "/resolve?name=api.example.test", true, false},
			{"an allowed name and port", dialPath("tcp", "api.example.test:443"), true, false},
			{"an allowed name, another port", dialPath("tcp", "api.example.test:8443"), false, true},
			{"an allowed name's address, not resolved", dialPath("tcp", in.AddrPort(1, 33, 443)), false, true},
			{"a name not on the list", "/resolve?name=other.example.test", false, true},
			{"a name answering a private address", dialPath("tcp", "inside.example.test:443"), false, true},
			{"a name answering cloud metadata", dialPath("tcp", "metadata.example.test:80"), false, true},
			{"address rule", dialPath("tcp", in.AddrPort(0, 10, 443)), true, false},
			{"address rule, another port", dialPath("tcp", in.AddrPort(0, 10, 8443)), false, true},
			{"udp rule", dialPath("udp", in.AddrPort(1, 10, 9000)), true, false},
			{"udp, another port", dialPath("udp", in.AddrPort(1, 10, 443)), false, true},
			{"udp where only tcp is allowed", dialPath("udp", in.AddrPort(0, 11, 443)), false, true},
			{"0.0.0.0/0 on a port", dialPath("tcp", in.AddrPort(1, 11, 9000)), true, false},
			{"0.0.0.0/0 does not reach the node", dialPath("tcp", net.JoinHostPort(gateway, "9000")), false, true},
			{"icmp", dialPath("icmp", in.Addr(1, 11).String()), false, true},
		}, never...),
	}
	for actor, ps := range probes {
		counted := 0
		for _, p := range ps {
			code, _, body := c.routerGetPath(actor, p.path)
			switch {
			case p.reach && code != http.StatusOK:
				t.Errorf("%s: %s (%s): %d %q, want it reached", actor, p.name, p.path, code, body)
			case !p.reach && code != http.StatusBadGateway:
				t.Errorf("%s: %s (%s): %d %q, want it refused (502 from the counter)", actor, p.name, p.path, code, body)
			}
			if p.counted {
				counted++
			}
		}
		c.waitFor(fmt.Sprintf("%d refusals of %s counted", counted, actor), func() bool {
			return c.egressDenied("default", actor) >= float64(counted)
		})
		// Sampled into the actor's events (at most a few per report).
		c.waitFor("refusals of "+actor+" in its events", func() bool {
			for _, e := range c.events(actor) {
				if strings.HasPrefix(e.GetReason(), "EgressDenied: ") && strings.Contains(e.GetReason(), "refused by the egress policy") {
					return true
				}
			}
			return false
		})
	}
	if n := c.egressDenied("default", "allow"); n > float64(len(never)) {
		t.Errorf("allow: %v refusals counted, want at most the %d never reachable", n, len(never))
	}
}

// egressDenied is torpor_egress_denied_total of an actor, summed over the
// cluster's nodes.
func (c *cluster) egressDenied(space, actor string) float64 {
	c.t.Helper()
	sum := 0.0
	for _, n := range c.nodes {
		families, err := n.metrics.Gather()
		if err != nil {
			c.t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != "torpor_egress_denied_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["space"] == space && labels["actor"] == actor {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
