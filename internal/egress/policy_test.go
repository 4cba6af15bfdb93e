package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/validate"
)

func rules(rs ...*torporv1.EgressRule) *torporv1.EgressPolicy {
	return &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOWLIST, Rules: rs}
}

func host(h string, ports ...string) *torporv1.EgressRule {
	return &torporv1.EgressRule{Host: h, Ports: ports}
}

func cidr(c string, ports ...string) *torporv1.EgressRule {
	return &torporv1.EgressRule{Cidr: c, Ports: ports}
}

func mustParse(t *testing.T, p *torporv1.EgressPolicy) Policy {
	t.Helper()
	out, err := Parse(p, "spec.egress")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return out
}

func TestParseRefusesNamingTheField(t *testing.T) {
	many := make([]*torporv1.EgressRule, 10_000)
	for i := range many {
		many[i] = cidr(fmt.Sprintf("203.0.%d.%d", i/256%256, i%256))
	}
	for _, tc := range []struct {
		name   string
		policy *torporv1.EgressPolicy
		path   string
	}{
		{"wildcard in the middle", rules(host("api.*.example.com")), "spec.egress.rules[0].host"},
		{"wildcard over a top-level domain", rules(host("*.com")), "spec.egress.rules[0].host"},
		{"address as a host", rules(host("203.0.113.7")), "spec.egress.rules[0].host"},
		{"bad label", rules(host("-api.example.com")), "spec.egress.rules[0].host"},
		{"malformed cidr", rules(host("ok.example.com"), cidr("203.0.113.0/33")), "spec.egress.rules[1].cidr"},
		{"not an address", rules(cidr("example.com")), "spec.egress.rules[0].cidr"},
		{"host bits", rules(cidr("203.0.113.7/24")), "spec.egress.rules[0].cidr"},
		{"ipv6", rules(cidr("2001:db8::/32")), "spec.egress.rules[0].cidr"},
		{"both", rules(&torporv1.EgressRule{Host: "a.example.com", Cidr: "203.0.113.0/24"}), "spec.egress.rules[0]"},
		{"neither", rules(&torporv1.EgressRule{}), "spec.egress.rules[0]"},
		{"port 0", rules(host("a.example.com", "0")), "spec.egress.rules[0].ports[0]"},
		{"port too big", rules(host("a.example.com", "443", "70000")), "spec.egress.rules[0].ports[1]"},
		{"backward range", rules(host("a.example.com", "9000-8000")), "spec.egress.rules[0].ports[0]"},
		{"10,000 rules", rules(many...), "spec.egress.rules"},
		{"rules with deny", &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_DENY, Rules: []*torporv1.EgressRule{host("a.example.com")}}, "spec.egress.rules"},
		{"unknown mode", &torporv1.EgressPolicy{Mode: 9}, "spec.egress.mode"},
		{"unknown protocol", rules(&torporv1.EgressRule{Host: "a.example.com", Protocol: 7}), "spec.egress.rules[0].protocol"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.policy, "spec.egress")
			var fe *validate.FieldError
			if !errors.As(err, &fe) || fe.Path != tc.path {
				t.Fatalf("Parse = %v, want a field error at %s", err, tc.path)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("%v is not an invalid argument", err)
			}
		})
	}
}

func TestParseNormalizes(t *testing.T) {
	p := mustParse(t, &torporv1.EgressPolicy{Rules: []*torporv1.EgressRule{
		host("API.Example.com.", "8443", "443", "8000-8444"),
		{Cidr: "198.51.100.7", Protocol: torporv1.EgressProtocol_EGRESS_PROTOCOL_UDP},
	}})
	if p.Mode != Allowlist {
		t.Fatalf("rules without a mode: mode %s, want allowlist", p.Mode)
	}
	if got, want := p.Rules[0].String(), "tcp api.example.com:443,8000-8444"; got != want {
		t.Fatalf("rule 0 = %q, want %q", got, want)
	}
	if got, want := p.Rules[1].String(), "udp 198.51.100.7/32:*"; got != want {
		t.Fatalf("rule 1 = %q, want %q", got, want)
	}
	again := mustParse(t, p.Proto())
	if fmt.Sprint(again) != fmt.Sprint(p) {
		t.Fatalf("Parse(Proto()) = %v, want %v", again, p)
	}
	if none := mustParse(t, nil); none.Mode != Unset || none.Proto() != nil {
		t.Fatalf("Parse(nil) = %v, want unset", none)
	}
}

func TestMatchHost(t *testing.T) {
	for _, tc := range []struct {
		pattern, name string
		want          bool
	}{
		{"api.example.com", "api.example.com", true},
		{"api.example.com", "API.example.com.", true},
		{"api.example.com", "x.api.example.com", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "badexample.com", false},
	} {
		if got := MatchHost(tc.pattern, tc.name); got != tc.want {
			t.Errorf("MatchHost(%q, %q) = %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
}

func TestWithin(t *testing.T) {
	deny := &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_DENY}
	allow := &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOW}
	list := rules(host("*.example.com", "443"), host("pypi.org", "80", "443"), cidr("198.51.100.0/24"))
	for _, tc := range []struct {
		name          string
		actor, outer  *torporv1.EgressPolicy
		wantErrAtPath string
	}{
		{"deny within deny", deny, deny, ""},
		{"deny within a list", deny, list, ""},
		{"allow within deny", allow, deny, "actor.egress.mode"},
		{"allow within a list", allow, list, "actor.egress.mode"},
		{"a list within allow", rules(host("x.org"), cidr("203.0.113.0/24")), allow, ""},
		{"a private range within allow", rules(cidr("10.1.0.0/16")), allow, "actor.egress.rules[0]"},
		{"a name below the wildcard", rules(host("a.b.example.com", "443")), list, ""},
		{"a narrower wildcard", rules(host("*.b.example.com", "443")), list, ""},
		{"the wildcard's own domain", rules(host("example.com", "443")), list, "actor.egress.rules[0]"},
		{"another port", rules(host("a.example.com", "8443")), list, "actor.egress.rules[0]"},
		{"every port", rules(host("pypi.org")), list, "actor.egress.rules[0]"},
		{"fewer ports", rules(host("pypi.org", "443")), list, ""},
		{"udp for a tcp rule", rules(&torporv1.EgressRule{Host: "pypi.org", Ports: []string{"443"}, Protocol: torporv1.EgressProtocol_EGRESS_PROTOCOL_UDP}), list, "actor.egress.rules[0]"},
		{"a sub-range", rules(cidr("198.51.100.128/25", "22")), list, ""},
		{"a wider range", rules(cidr("198.51.0.0/16")), list, "actor.egress.rules[0]"},
		{"an address for a name", rules(host("pypi.org", "443"), cidr("203.0.113.7")), list, "actor.egress.rules[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outer := mustParse(t, tc.outer)
			_, err := Effective(outer, mustParse(t, tc.actor), "actor.egress")
			checkPath(t, err, tc.wantErrAtPath)
		})
	}
	t.Run("a stored template without a policy allows", func(t *testing.T) {
		got, err := Effective(Policy{}, Policy{}, "actor.egress")
		if err != nil || got.Mode != Allow {
			t.Fatalf("Effective(unset, unset) = %v, %v; want allow", got, err)
		}
	})
}

func checkPath(t *testing.T, err error, path string) {
	t.Helper()
	if path == "" {
		if err != nil {
			t.Fatalf("err = %v, want none", err)
		}
		return
	}
	var fe *validate.FieldError
	if !errors.As(err, &fe) || fe.Path != path {
		t.Fatalf("err = %v, want a field error at %s", err, path)
	}
}

func TestAdmit(t *testing.T) {
	allow := &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOW}
	bounded := &torporv1.EgressBounds{Hosts: []string{"*.example.com", "pypi.org"}, Cidrs: []string{"198.51.100.0/24"}}
	for _, tc := range []struct {
		name    string
		bounds  *torporv1.EgressBounds
		policy  *torporv1.EgressPolicy
		errPath string
	}{
		{"default bounds: names", nil, rules(host("anything.example.net", "443")), ""},
		{"default bounds: no allow", nil, allow, "spec.egress.mode"},
		{"default bounds: 0.0.0.0/0", nil, rules(cidr("0.0.0.0/0")), "spec.egress.rules[0].cidr"},
		{"allowAny", &torporv1.EgressBounds{AllowAny: true}, allow, ""},
		{"a name within", bounded, rules(host("a.example.com")), ""},
		{"a name outside", bounded, rules(host("pypi.org"), host("evil.net")), "spec.egress.rules[1].host"},
		{"a range within", bounded, rules(cidr("198.51.100.64/26")), ""},
		{"0.0.0.0/0 outside", bounded, rules(cidr("0.0.0.0/0")), "spec.egress.rules[0].cidr"},
		{"metadata outside", bounded, rules(cidr("169.254.169.254")), "spec.egress.rules[0].cidr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ParseBounds(tc.bounds, "spec.egressBounds")
			if err != nil {
				t.Fatal(err)
			}
			err = b.Admit(mustParse(t, tc.policy), "spec.egress", "team")
			checkPath(t, err, tc.errPath)
			if err != nil && !strings.Contains(err.Error(), "team") {
				t.Fatalf("%v does not name the space", err)
			}
		})
	}
	if _, err := ParseBounds(&torporv1.EgressBounds{Cidrs: []string{"10.0.0.0/x"}}, "spec.egressBounds"); err == nil {
		t.Fatal("ParseBounds accepted a malformed range")
	}
}

func TestPublic(t *testing.T) {
	for addr, want := range map[string]bool{
		"203.0.113.7": true, "198.51.100.1": true, "8.8.8.8": true,
		"10.213.0.1": false, "169.254.169.254": false, "127.0.0.1": false, "192.168.1.1": false,
		"100.64.0.1": false, "::1": false, "2001:db8::1": false, "::ffff:10.0.0.1": false,
	} {
		a := mustAddr(t, addr)
		if got := Public(a); got != want {
			t.Errorf("Public(%s) = %v, want %v", addr, got, want)
		}
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
