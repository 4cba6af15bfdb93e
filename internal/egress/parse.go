package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/validate"
)

// MaxRules bounds a policy: every rule is a firewall rule in the node's
// path of every packet the sandbox sends.
const MaxRules = 256

// maxPortRanges bounds one rule's ports.
const maxPortRanges = 32

// Parse checks and normalizes an API policy; field is its JSON path
// ("spec.egress"), named by every error. nil, or no mode and no rules, is
// Unset. Rules without a mode make an allowlist.
func Parse(p *torporv1.EgressPolicy, field string) (Policy, error) {
	if p == nil {
		return Policy{}, nil
	}
	var out Policy
	switch p.GetMode() {
	case torporv1.EgressMode_EGRESS_MODE_UNSPECIFIED:
		if len(p.GetRules()) > 0 {
			out.Mode = Allowlist
		}
	case torporv1.EgressMode_EGRESS_MODE_DENY:
		out.Mode = Deny
	case torporv1.EgressMode_EGRESS_MODE_ALLOW:
		out.Mode = Allow
	case torporv1.EgressMode_EGRESS_MODE_ALLOWLIST:
		out.Mode = Allowlist
	default:
		return Policy{}, fieldErr(field+".mode", "%d is not a mode (DENY, ALLOW or ALLOWLIST)", p.GetMode())
	}
	if out.Mode != Allowlist && len(p.GetRules()) > 0 {
		return Policy{}, fieldErr(field+".rules", "rules need mode ALLOWLIST, not %s", strings.ToUpper(out.Mode.String()))
	}
	if n := len(p.GetRules()); n > MaxRules {
		return Policy{}, fieldErr(field+".rules", "%d rules, at most %d: name a domain (*.example.com) or a range instead of each host or address", n, MaxRules)
	}
	for i, pr := range p.GetRules() {
		r, err := parseRule(pr, fmt.Sprintf("%s.rules[%d]", field, i))
		if err != nil {
			return Policy{}, err
		}
		out.Rules = append(out.Rules, r)
	}
	return out, nil
}

func parseRule(pr *torporv1.EgressRule, at string) (Rule, error) {
	var r Rule
	switch {
	case pr.GetHost() != "" && pr.GetCidr() != "":
		return Rule{}, fieldErr(at, "host %q and cidr %q: a rule names one of them", pr.GetHost(), pr.GetCidr())
	case pr.GetHost() != "":
		host, err := parseHost(pr.GetHost())
		if err != nil {
			return Rule{}, fieldErr(at+".host", "%s", err)
		}
		r.Host = host
	case pr.GetCidr() != "":
		prefix, err := parseCIDR(pr.GetCidr())
		if err != nil {
			return Rule{}, fieldErr(at+".cidr", "%s", err)
		}
		r.Prefix = prefix
	default:
		return Rule{}, fieldErr(at, "names neither a host nor a cidr")
	}
	switch pr.GetProtocol() {
	case torporv1.EgressProtocol_EGRESS_PROTOCOL_UNSPECIFIED, torporv1.EgressProtocol_EGRESS_PROTOCOL_TCP:
		r.Protocol = TCP
	case torporv1.EgressProtocol_EGRESS_PROTOCOL_UDP:
		r.Protocol = UDP
	default:
		return Rule{}, fieldErr(at+".protocol", "%d is not a protocol (TCP or UDP)", pr.GetProtocol())
	}
	ports, err := parsePorts(pr.GetPorts(), at+".ports")
	if err != nil {
		return Rule{}, err
	}
	r.Ports = ports
	return r, nil
}

// parseHost accepts a DNS name, or "*." and a domain of at least two
// labels, and returns it in lower case without a trailing dot.
func parseHost(s string) (string, error) {
	host := strings.ToLower(strings.TrimSuffix(s, "."))
	if _, err := netip.ParseAddr(host); err == nil {
		return "", fmt.Errorf("%q is an address: name it as cidr", s)
	}
	if len(host) > 253 {
		return "", fmt.Errorf("%q is longer than 253 bytes", s)
	}
	name, wildcard := strings.CutPrefix(host, "*.")
	labels := strings.Split(name, ".")
	if wildcard && len(labels) < 2 {
		return "", fmt.Errorf("%q: a wildcard needs a domain of at least two labels (*.example.com)", s)
	}
	for _, l := range labels {
		if strings.Contains(l, "*") {
			return "", fmt.Errorf("%q: a wildcard may only be the whole first label (*.example.com)", s)
		}
		if err := label(l); err != nil {
			return "", fmt.Errorf("%q: %w", s, err)
		}
	}
	return host, nil
}

func label(l string) error {
	if l == "" || len(l) > 63 {
		return fmt.Errorf("label %q must be 1 to 63 bytes", l)
	}
	for i, c := range l {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' && i > 0 && i < len(l)-1
		if !ok {
			return fmt.Errorf("label %q: letters, digits and inner hyphens only", l)
		}
	}
	return nil
}

// parseCIDR accepts an IPv4 address or prefix without host bits.
func parseCIDR(s string) (netip.Prefix, error) {
	var prefix netip.Prefix
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not an address or CIDR range", s)
		}
		prefix = p
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not an address or CIDR range", s)
		}
		prefix = netip.PrefixFrom(a, a.BitLen())
	}
	if !prefix.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("%q: sandboxes have IPv4 only; IPv6 is never routed", s)
	}
	if m := prefix.Masked(); m != prefix {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set: %s is the range", s, m)
	}
	return prefix, nil
}

// parsePorts reads "443" and "8000-8999" items into sorted, merged ranges;
// none is every port.
func parsePorts(items []string, at string) ([]PortRange, error) {
	if len(items) == 0 {
		return slices.Clone(allPorts), nil
	}
	if len(items) > maxPortRanges {
		return nil, fieldErr(at, "%d items, at most %d: give ranges (8000-8999)", len(items), maxPortRanges)
	}
	var ranges []PortRange
	for i, item := range items {
		first, last, isRange := strings.Cut(item, "-")
		lo, err := portNumber(first)
		hi := lo
		if err == nil && isRange {
			hi, err = portNumber(last)
		}
		if err == nil && hi < lo {
			err = fmt.Errorf("the range ends before it starts")
		}
		if err != nil {
			return nil, fieldErr(fmt.Sprintf("%s[%d]", at, i), "%q: %s (a port 1-65535, or a range such as 8000-8999)", item, err)
		}
		ranges = append(ranges, PortRange{lo, hi})
	}
	return merge(ranges), nil
}

func portNumber(s string) (uint16, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a port", s)
	}
	return uint16(n), nil
}

// merge sorts ranges and joins those that overlap or touch.
func merge(ranges []PortRange) []PortRange {
	slices.SortFunc(ranges, func(a, b PortRange) int { return int(a.First) - int(b.First) })
	var out []PortRange
	for _, r := range ranges {
		if n := len(out); n > 0 && uint32(r.First) <= uint32(out[n-1].Last)+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

func fieldErr(path, format string, args ...any) error {
	return &validate.FieldError{Path: path, Reason: fmt.Sprintf(format, args...)}
}
