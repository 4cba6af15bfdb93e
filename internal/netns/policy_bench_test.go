package netns

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
	"github.com/torpor-dev/torpor/internal/netns/netnstest"
)

// BenchmarkSlotPolicyConnect: one TCP connection (connect, the echo
// server's line, close) from a slot's namespace to the test internet,
// through the node's firewall, under allow and under an allowlist of 50
// rules whose last one matches (the worst case: every rule is tried),
// in the same run. Only a connection's first packet walks the slot's
// chain; the rest are established.
func BenchmarkSlotPolicyConnect(b *testing.B) {
	in := netnstest.NewInternet(b)
	n := testNetworkWith(b, true)
	ctx := context.Background()
	s, err := n.Slot(ctx, "w0", 0)
	if err != nil {
		b.Fatal(err)
	}
	var rules []*torporv1.EgressRule
	for i := range 49 {
		rules = append(rules, &torporv1.EgressRule{Cidr: fmt.Sprintf("%s/32", in.Addr(0, i+1)), Ports: []string{"8443"}})
	}
	rules = append(rules, &torporv1.EgressRule{Cidr: in.Ranges[1].String(), Ports: []string{"443"}})
	list, err := egress.Parse(&torporv1.EgressPolicy{Rules: rules}, "egress")
	if err != nil {
		b.Fatal(err)
	}
	target := in.AddrPort(1, 10, 443)
	for _, bc := range []struct {
		name string
		p    egress.Policy
	}{{"allow", egress.Policy{Mode: egress.Allow}}, {"allowlist-50", list}} {
		b.Run(bc.name, func(b *testing.B) {
			if err := n.ApplyPolicy(ctx, 0, bc.p); err != nil {
				b.Fatal(err)
			}
			netnstest.InNS(s.NetNS, func() error {
				b.ResetTimer()
				for b.Loop() {
					c, err := net.DialTimeout("tcp4", target, 2*time.Second)
					if err != nil {
						b.Fatal(err)
					}
					buf := make([]byte, 64)
					if _, err := c.Read(buf); err != nil {
						b.Fatal(err)
					}
					c.Close()
				}
				return nil
			})
		})
	}
}
