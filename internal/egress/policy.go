// Package egress is the egress policy of a sandbox: where its connections
// may go beyond its node. The control plane parses and bounds policies at
// apply (a space token's within its space's bounds, an actor's within its
// template's); the node enforces the effective one in the sandbox's
// network (a resolver that answers allowed names only, and a firewall that
// lets through what the rules and those answers cover).
//
// Whatever the policy, the addresses in Protected, and the node's own, are
// reached only by an address rule that lies inside them: a rule naming
// 10.1.2.0/24 reaches it, a rule naming 0.0.0.0/0 or an allowed name that
// resolves there does not.
package egress

import (
	"fmt"
	"net/netip"
	"slices"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// Mode is a policy's kind.
type Mode int

const (
	// Unset is no policy: an actor's means its template's, a stored
	// template's means one written before policies existed (Allow).
	Unset Mode = iota
	Deny
	Allow
	Allowlist
)

func (m Mode) String() string {
	switch m {
	case Deny:
		return "deny"
	case Allow:
		return "allow"
	case Allowlist:
		return "allowlist"
	}
	return "unset"
}

// Protocol is an IP protocol number.
type Protocol uint8

const (
	TCP Protocol = 6
	UDP Protocol = 17
)

func (p Protocol) String() string {
	if p == UDP {
		return "udp"
	}
	return "tcp"
}

// PortRange is First..Last, inclusive.
type PortRange struct{ First, Last uint16 }

// allPorts is a rule's range when it names none.
var allPorts = []PortRange{{1, 65535}}

func (r PortRange) String() string {
	if r.First == r.Last {
		return fmt.Sprint(r.First)
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// Rule allows one destination: a host name pattern or an address prefix,
// on some ports of one protocol.
type Rule struct {
	// Host is a lower-case name, exact or "*." and a domain; empty for an
	// address rule.
	Host string
	// Prefix is an IPv4 prefix, valid only when Host is empty.
	Prefix   netip.Prefix
	Protocol Protocol
	// Ports are sorted and disjoint; never empty (every port is 1-65535).
	Ports []PortRange
}

// Allows reports whether the rule's ports and protocol cover a connection
// to port over proto (the destination is the caller's to match).
func (r Rule) Allows(proto Protocol, port uint16) bool {
	if proto != r.Protocol {
		return false
	}
	for _, pr := range r.Ports {
		if port >= pr.First && port <= pr.Last {
			return true
		}
	}
	return false
}

func (r Rule) String() string {
	dest := r.Host
	if dest == "" {
		dest = r.Prefix.String()
	}
	ports := "*"
	if !slices.Equal(r.Ports, allPorts) {
		ports = ""
		for i, pr := range r.Ports {
			if i > 0 {
				ports += ","
			}
			ports += pr.String()
		}
	}
	return fmt.Sprintf("%s %s:%s", r.Protocol, dest, ports)
}

// Policy is a parsed, normalized egress policy.
type Policy struct {
	Mode Mode
	// Rules are set only with Allowlist.
	Rules []Rule
}

// Proto is the policy in API form, its mode explicit.
func (p Policy) Proto() *torporv1.EgressPolicy {
	if p.Mode == Unset {
		return nil
	}
	out := &torporv1.EgressPolicy{Mode: modeProto[p.Mode]}
	for _, r := range p.Rules {
		pr := &torporv1.EgressRule{Host: r.Host, Protocol: torporv1.EgressProtocol_EGRESS_PROTOCOL_TCP}
		if r.Host == "" {
			pr.Cidr = r.Prefix.String()
		}
		if r.Protocol == UDP {
			pr.Protocol = torporv1.EgressProtocol_EGRESS_PROTOCOL_UDP
		}
		if !slices.Equal(r.Ports, allPorts) {
			for _, port := range r.Ports {
				pr.Ports = append(pr.Ports, port.String())
			}
		}
		out.Rules = append(out.Rules, pr)
	}
	return out
}

var modeProto = map[Mode]torporv1.EgressMode{
	Deny:      torporv1.EgressMode_EGRESS_MODE_DENY,
	Allow:     torporv1.EgressMode_EGRESS_MODE_ALLOW,
	Allowlist: torporv1.EgressMode_EGRESS_MODE_ALLOWLIST,
}

// Effective is the policy a workload runs under: the template's (a stored
// template without one keeps the behaviour of its time, Allow), or the
// actor's, which must lie within it.
func Effective(template, actor Policy, actorField string) (Policy, error) {
	if template.Mode == Unset {
		template = Policy{Mode: Allow}
	}
	if actor.Mode == Unset {
		return template, nil
	}
	if err := actor.Within(template, actorField); err != nil {
		return Policy{}, err
	}
	return actor, nil
}
