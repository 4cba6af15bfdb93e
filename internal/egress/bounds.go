package egress

import (
	"fmt"
	"net/netip"
	"strings"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// Protected are the ranges no policy reaches unless an address rule lies
// inside one of them: this network, private ranges (RFC 1918, shared
// address space), loopback, link-local (cloud metadata at
// 169.254.169.254), multicast and reserved. The node adds its own
// addresses and its workers' subnet.
var Protected = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// Public reports whether an address lies outside every Protected range:
// what Allow and an allowed name's answers may reach.
func Public(a netip.Addr) bool {
	a = a.Unmap()
	if !a.Is4() {
		return false
	}
	for _, p := range Protected {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// Inside reports whether prefix lies within one of ranges: a rule inside
// a protected range reaches it.
func Inside(prefix netip.Prefix, ranges []netip.Prefix) bool {
	for _, r := range ranges {
		if r.Bits() <= prefix.Bits() && r.Contains(prefix.Addr()) {
			return true
		}
	}
	return false
}

// MatchHost reports whether a query name matches a rule's pattern: the
// name itself, or for "*.example.com" any name below example.com (not
// example.com itself). name is compared case-insensitively, without a
// trailing dot.
func MatchHost(pattern, name string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if domain, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(name, "."+domain)
	}
	return name == pattern
}

// coversHost reports whether every name pattern inner matches, outer
// matches too.
func coversHost(outer, inner string) bool {
	if domain, ok := strings.CutPrefix(inner, "*."); ok {
		// *.a.example.com lies within *.example.com, not within a.example.com.
		return strings.HasPrefix(outer, "*.") && (outer == inner || MatchHost(outer, domain))
	}
	return MatchHost(outer, inner)
}

// coversPorts reports whether outer's ranges (sorted, merged) hold every
// port of inner's.
func coversPorts(outer, inner []PortRange) bool {
	for _, in := range inner {
		covered := false
		for _, out := range outer {
			if in.First >= out.First && in.Last <= out.Last {
				covered = true
				break
			}
		}
		if !covered {
			return false
		}
	}
	return true
}

// covers reports whether outer allows everything inner does.
func (outer Rule) covers(inner Rule) bool {
	if outer.Protocol != inner.Protocol || !coversPorts(outer.Ports, inner.Ports) {
		return false
	}
	if inner.Host != "" {
		return outer.Host != "" && coversHost(outer.Host, inner.Host)
	}
	return outer.Host == "" && Inside(inner.Prefix, []netip.Prefix{outer.Prefix})
}

// Within checks that p allows nothing outer does not; field is p's JSON
// path, named by the error with the first rule outer does not cover.
func (p Policy) Within(outer Policy, field string) error {
	switch {
	case p.Mode == Deny || outer.Mode == Allow && p.Mode == Allow:
		return nil
	case outer.Mode == Deny:
		return fieldErr(field+".mode", "%s is wider than the template's policy, deny", p.Mode)
	case p.Mode == Allow:
		return fieldErr(field+".mode", "allow is wider than the template's allowlist: name the destinations the actor needs")
	}
	for i, r := range p.Rules {
		if outer.Mode == Allow {
			if r.Host != "" || !Inside(r.Prefix, Protected) {
				continue
			}
			return fieldErr(fmt.Sprintf("%s.rules[%d]", field, i), "%s names a protected range, which the template's allow does not reach", r)
		}
		if !anyCovers(outer.Rules, r) {
			return fieldErr(fmt.Sprintf("%s.rules[%d]", field, i), "%s is not within any rule of the template's allowlist", r)
		}
	}
	return nil
}

func anyCovers(outer []Rule, r Rule) bool {
	for _, o := range outer {
		if o.covers(r) {
			return true
		}
	}
	return false
}

// Bounds are what a space token may apply (SpaceSpec.egress_bounds).
type Bounds struct {
	AllowAny bool
	// Hosts are name patterns rules must lie within; empty: any name.
	Hosts []string
	// CIDRs are ranges address rules must lie within; empty: no address
	// rules.
	CIDRs []netip.Prefix
}

// ParseBounds checks API bounds; field is their JSON path
// ("spec.egressBounds"). nil is the default: deny, and name rules only.
func ParseBounds(b *torporv1.EgressBounds, field string) (Bounds, error) {
	out := Bounds{AllowAny: b.GetAllowAny()}
	for i, h := range b.GetHosts() {
		host, err := parseHost(h)
		if err != nil {
			return Bounds{}, fieldErr(fmt.Sprintf("%s.hosts[%d]", field, i), "%s", err)
		}
		out.Hosts = append(out.Hosts, host)
	}
	for i, c := range b.GetCidrs() {
		prefix, err := parseCIDR(c)
		if err != nil {
			return Bounds{}, fieldErr(fmt.Sprintf("%s.cidrs[%d]", field, i), "%s", err)
		}
		out.CIDRs = append(out.CIDRs, prefix)
	}
	return out, nil
}

// Admit checks a policy a space token applies against its space's bounds;
// field is the policy's JSON path, space the space's name, both named by
// the error.
func (b Bounds) Admit(p Policy, field, space string) error {
	if p.Mode == Allow && !b.AllowAny {
		return fieldErr(field+".mode", "allow is outside space %s's egress bounds (an administrator sets egressBounds.allowAny): use an allowlist", space)
	}
	for i, r := range p.Rules {
		at := fmt.Sprintf("%s.rules[%d]", field, i)
		switch {
		case r.Host != "" && len(b.Hosts) > 0 && !anyHost(b.Hosts, r.Host):
			return fieldErr(at+".host", "%s is outside space %s's egress bounds (names within %s)", r.Host, space, strings.Join(b.Hosts, ", "))
		case r.Host == "" && len(b.CIDRs) == 0:
			return fieldErr(at+".cidr", "%s: space %s's egress bounds allow no address rules (an administrator sets egressBounds.cidrs); name the host instead", r.Prefix, space)
		case r.Host == "" && !Inside(r.Prefix, b.CIDRs):
			return fieldErr(at+".cidr", "%s is outside space %s's egress bounds (%s)", r.Prefix, space, prefixes(b.CIDRs))
		}
	}
	return nil
}

func anyHost(patterns []string, host string) bool {
	for _, p := range patterns {
		if coversHost(p, host) {
			return true
		}
	}
	return false
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}
