package e2b

import (
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
)

// A create's allow_internet_access and network.allowOut / denyOut map
// onto the sandbox's egress policy (the actor's spec.egress, which may
// only narrow its template's). E2B's model is default-allow with deny
// lists that allow entries override; Torpor's is an allowlist. They meet
// where E2B denies everything: allow_internet_access false, or denyOut
// holding ALL_TRAFFIC (0.0.0.0/0), is DENY, and with allowOut an
// ALLOWLIST of its entries. What only a deny list could say (denyOut of
// some addresses, the rest allowed) is refused naming the entry, and so
// is allowOut without denying the rest: E2B would let every address
// through then, and Torpor reading the list as an allowlist would
// silently be stricter than the caller's E2B code; both say what to write
// instead.

// allTraffic is the SDK's ALL_TRAFFIC.
const allTraffic = "0.0.0.0/0"

// maxAllowOut bounds allowOut: each entry is a TCP and a UDP rule.
const maxAllowOut = egress.MaxRules / 2

// sandboxEgress is the egress policy a create asks for the sandbox, nil
// for the template's (allow_internet_access true, or left out, with no
// network lists: the template's policy, which E2B's true is no way past).
func sandboxEgress(b newSandbox) (*torporv1.EgressPolicy, error) {
	var n networkBody
	if b.Network != nil {
		n = *b.Network
	}
	denyAll := b.AllowInternetAccess != nil && !*b.AllowInternetAccess || slices.Contains(n.DenyOut, allTraffic)
	for i, d := range n.DenyOut {
		at := fmt.Sprintf("network.denyOut[%d]", i)
		switch {
		case d == allTraffic:
		case !denyAll:
			return nil, badRequest(at, "%q: Torpor's egress policies are allowlists, so denying some addresses is not supported: deny all traffic (%s, ALL_TRAFFIC) and list what the sandbox may reach in allowOut", d, allTraffic)
		case !isAddress(d):
			// Within ALL_TRAFFIC, so nothing to enforce; still an entry
			// E2B would refuse.
			return nil, badRequest(at, "%q is not an address or CIDR range (denyOut takes no names)", d)
		}
	}
	switch {
	case len(n.AllowOut) > 0 && !denyAll:
		return nil, badRequest("network.allowOut", "an allow list without denyOut [%s] (ALL_TRAFFIC) restricts nothing in E2B, and Torpor does not guess: add denyOut [%s] to allow only these destinations, or leave allowOut out", allTraffic, allTraffic)
	case len(n.AllowOut) > maxAllowOut:
		return nil, badRequest("network.allowOut", "%d entries, at most %d: name a domain (*.example.com) or a range instead of each host or address", len(n.AllowOut), maxAllowOut)
	case len(n.AllowOut) > 0:
		p := allowlist(n.AllowOut)
		if _, err := egress.Parse(p, "egress"); err != nil {
			return nil, &apiError{status: http.StatusBadRequest, message: nameAllowOut(err.Error(), n.AllowOut)}
		}
		return p, nil
	case denyAll:
		return &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_DENY}, nil
	}
	return nil, nil
}

// allowlist is allowOut as an allowlist: each entry, a host name or an
// address or CIDR range, on every port over TCP (rule 2i) and UDP (rule
// 2i+1), as E2B allows it.
func allowlist(allowOut []string) *torporv1.EgressPolicy {
	p := &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOWLIST}
	for _, entry := range allowOut {
		for _, proto := range []torporv1.EgressProtocol{torporv1.EgressProtocol_EGRESS_PROTOCOL_TCP, torporv1.EgressProtocol_EGRESS_PROTOCOL_UDP} {
			r := &torporv1.EgressRule{Protocol: proto}
			if isAddress(entry) || strings.Contains(entry, "/") {
				r.Cidr = entry
			} else {
				r.Host = entry
			}
			p.Rules = append(p.Rules, r)
		}
	}
	return p
}

func isAddress(s string) bool {
	if _, err := netip.ParsePrefix(s); err == nil {
		return true
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}

// ruleField is how an error names a rule of the policy allowlist made:
// "egress.rules[3]" (the gateway's own check, and the control plane's
// space bounds) or "spec.egress.rules[3]" (its template's), with the
// rule's field after it.
var ruleField = regexp.MustCompile(`(?:spec\.)?egress\.rules\[(\d+)\](?:\.[a-z]+)?`)

// nameAllowOut rewrites an error message about a rule of allowlist's
// policy to name the allowOut entry it came from, as the caller wrote it.
func nameAllowOut(msg string, allowOut []string) string {
	return ruleField.ReplaceAllStringFunc(msg, func(m string) string {
		k, err := strconv.Atoi(ruleField.FindStringSubmatch(m)[1])
		if err != nil || k/2 >= len(allowOut) {
			return m
		}
		return fmt.Sprintf("network.allowOut[%d] (%q)", k/2, allowOut[k/2])
	})
}

// networkOf is a sandbox's own egress policy in E2B's terms for GET
// /sandboxes/{id}: allow_internet_access and network as a create that
// makes it would send them. A sandbox without one (it runs under its
// template's policy) has neither.
func networkOf(a *torporv1.Actor) (allowInternetAccess *bool, network *networkInfo) {
	p := a.GetSpec().GetEgress()
	switch p.GetMode() {
	case torporv1.EgressMode_EGRESS_MODE_DENY:
		no := false
		return &no, &networkInfo{DenyOut: []string{allTraffic}}
	case torporv1.EgressMode_EGRESS_MODE_ALLOWLIST:
		info := &networkInfo{DenyOut: []string{allTraffic}}
		for _, r := range p.GetRules() {
			dest := r.GetHost()
			if dest == "" {
				dest = r.GetCidr()
				if prefix, err := netip.ParsePrefix(dest); err == nil && prefix.IsSingleIP() {
					dest = prefix.Addr().String()
				}
			}
			if !slices.Contains(info.AllowOut, dest) {
				info.AllowOut = append(info.AllowOut, dest)
			}
		}
		return nil, info
	}
	return nil, nil
}
