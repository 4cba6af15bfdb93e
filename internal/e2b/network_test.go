package e2b

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// createdEgress checks the egress policy the create asked the control
// plane for.
func createdEgress(want *torporv1.EgressPolicy) func(t *testing.T, f *fakeAPI, _ []byte) {
	return func(t *testing.T, f *fakeAPI, _ []byte) {
		t.Helper()
		if got := lastCall[*torporv1.CreateSandboxRequest](t, f, "CreateSandbox").GetEgress(); !proto.Equal(got, want) {
			t.Errorf("CreateSandbox egress %v, want %v", got, want)
		}
	}
}

// everywhere is dest on every port over TCP and UDP: an allowOut entry.
func everywhere(host, cidr string) []*torporv1.EgressRule {
	return []*torporv1.EgressRule{
		{Host: host, Cidr: cidr, Protocol: torporv1.EgressProtocol_EGRESS_PROTOCOL_TCP},
		{Host: host, Cidr: cidr, Protocol: torporv1.EgressProtocol_EGRESS_PROTOCOL_UDP},
	}
}

func TestCreateNetwork(t *testing.T) {
	allowlist := &torporv1.EgressPolicy{
		Mode:  torporv1.EgressMode_EGRESS_MODE_ALLOWLIST,
		Rules: append(append(everywhere("api.example.com", ""), everywhere("*.example.org", "")...), everywhere("", "198.51.100.0/24")...),
	}
	deny := &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_DENY}
	tooMany := make([]string, maxAllowOut+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf(`"h%d.example.com"`, i)
	}
	for _, c := range []apiCase{
		{name: "allowOut with denyOut ALL_TRAFFIC is an allowlist of its entries", method: "POST", path: "/v2/sandboxes",
			body:   `{"templateID":"base","network":{"allowOut":["api.example.com","*.example.org","198.51.100.0/24"],"denyOut":["0.0.0.0/0"]}}`,
			status: 201, check: createdEgress(allowlist)},
		{name: "allowOut without internet access is an allowlist too", method: "POST", path: "/v2/sandboxes",
			body:   `{"templateID":"base","allow_internet_access":false,"network":{"allowOut":["api.example.com","*.example.org","198.51.100.0/24"]}}`,
			status: 201, check: createdEgress(allowlist)},
		{name: "a bare address is its /32", method: "POST", path: "/v2/sandboxes",
			body:   `{"templateID":"base","network":{"allowOut":["198.51.100.7"],"denyOut":["0.0.0.0/0"]}}`,
			status: 201, check: createdEgress(&torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOWLIST, Rules: everywhere("", "198.51.100.7")})},
		{name: "denyOut ALL_TRAFFIC alone is DENY", method: "POST", path: "/v2/sandboxes",
			body: `{"templateID":"base","network":{"denyOut":["0.0.0.0/0"]}}`, status: 201, check: createdEgress(deny)},
		{name: "more denied within ALL_TRAFFIC is still DENY", method: "POST", path: "/v2/sandboxes",
			body: `{"templateID":"base","network":{"denyOut":["0.0.0.0/0","10.0.0.0/8"]}}`, status: 201, check: createdEgress(deny)},
		{name: "an empty network is the template's", method: "POST", path: "/v2/sandboxes",
			body: `{"templateID":"base","network":{"allowOut":[],"denyOut":[]}}`, status: 201, check: createdEgress(nil)},
		{name: "allowOut without denying the rest", method: "POST", path: "/v2/sandboxes",
			body:   `{"templateID":"base","network":{"allowOut":["api.example.com"]}}`,
			status: 400, message: "network.allowOut: an allow list without denyOut [0.0.0.0/0]", check: notCalled("CreateSandbox")},
		{name: "denying some addresses", method: "POST", path: "/v2/sandboxes",
			body:   `{"templateID":"base","network":{"denyOut":["8.8.8.8"]}}`,
			status: 400, message: `network.denyOut[0]: "8.8.8.8": Torpor's egress policies are allowlists`, check: notCalled("CreateSandbox")},
		{name: "denying a name", method: "POST", path: "/v2/sandboxes",
			body:   `{"templateID":"base","network":{"denyOut":["0.0.0.0/0","evil.example.com"]}}`,
			status: 400, message: `network.denyOut[1]: "evil.example.com" is not an address`, check: notCalled("CreateSandbox")},
		{name: "a malformed entry is named", method: "POST", path: "/v2/sandboxes",
			body:   `{"templateID":"base","network":{"allowOut":["ok.example.com","a.*.example.com"],"denyOut":["0.0.0.0/0"]}}`,
			status: 400, message: `network.allowOut[1] ("a.*.example.com")`, check: notCalled("CreateSandbox")},
		{name: "an IPv6 entry is named", method: "POST", path: "/v2/sandboxes",
			body:   `{"templateID":"base","network":{"allowOut":["2001:db8::1"],"denyOut":["0.0.0.0/0"]}}`,
			status: 400, message: `network.allowOut[0] ("2001:db8::1")`, check: notCalled("CreateSandbox")},
		{name: "too many entries", method: "POST", path: "/v2/sandboxes",
			body:   `{"templateID":"base","network":{"allowOut":[` + strings.Join(tooMany, ",") + `],"denyOut":["0.0.0.0/0"]}}`,
			status: 400, message: "network.allowOut: 129 entries, at most 128", check: notCalled("CreateSandbox")},
		{name: "an entry outside the template's policy is named", method: "POST", path: "/v2/sandboxes",
			body: `{"templateID":"base","network":{"allowOut":["api.example.com","203.0.113.9"],"denyOut":["0.0.0.0/0"]}}`,
			setup: func(f *fakeAPI) {
				// As the control plane words it (workflow.EffectiveEgress).
				f.fail["CreateSandbox"] = connect.NewError(connect.CodeInvalidArgument, errors.New("template base-1: spec.egress.rules[2]: tcp 203.0.113.9/32:* is not within any rule of the template's allowlist"))
			},
			status: 400, message: `template base-1: network.allowOut[1] ("203.0.113.9"): tcp 203.0.113.9/32:* is not within`},
		{name: "an entry outside the space's bounds is named", method: "POST", path: "/v2/sandboxes",
			body: `{"templateID":"base","network":{"allowOut":["api.example.com"],"denyOut":["0.0.0.0/0"]}}`,
			setup: func(f *fakeAPI) {
				f.fail["CreateSandbox"] = connect.NewError(connect.CodeInvalidArgument, errors.New("egress.rules[1].host: api.example.com is outside space team-a's egress bounds (names within *.internal.example)"))
			},
			status: 400, message: `network.allowOut[0] ("api.example.com"): api.example.com is outside space team-a's egress bounds`},
		{name: "transform rules", method: "POST", path: "/v2/sandboxes",
			body: `{"templateID":"base","network":{"rules":{"api.example.com":[{}]}}}`, status: 400, message: "network.rules:", check: notCalled("CreateSandbox")},
		{name: "an egress proxy", method: "POST", path: "/v2/sandboxes",
			body: `{"templateID":"base","network":{"egressProxy":{"address":"p.example.com:1080"}}}`, status: 400, message: "network.egressProxy:"},
	} {
		t.Run(c.name, c.run)
	}
}

func TestGetNetwork(t *testing.T) {
	withEgress := func(p *torporv1.EgressPolicy) func(f *fakeAPI) {
		return func(f *fakeAPI) {
			a := sandboxActor(spaceA, "net1", torporv1.ActorState_ACTOR_STATE_RUNNING, nil)
			a.Spec.Egress = p
			f.put(a)
		}
	}
	for _, c := range []apiCase{
		{name: "an allowlist is allowOut and denyOut ALL_TRAFFIC", method: "GET", path: "/sandboxes/net1",
			setup: withEgress(&torporv1.EgressPolicy{
				Mode:  torporv1.EgressMode_EGRESS_MODE_ALLOWLIST,
				Rules: append(everywhere("api.example.com", ""), everywhere("", "198.51.100.7/32")...),
			}),
			status: 200, fields: map[string]any{
				"network":             map[string]any{"allowOut": []any{"api.example.com", "198.51.100.7"}, "denyOut": []any{"0.0.0.0/0"}},
				"allowInternetAccess": nil,
			}},
		{name: "DENY is no internet access", method: "GET", path: "/sandboxes/net1",
			setup:  withEgress(&torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_DENY}),
			status: 200, fields: map[string]any{"network": map[string]any{"denyOut": []any{"0.0.0.0/0"}}, "allowInternetAccess": false}},
		{name: "the template's policy is neither", method: "GET", path: "/sandboxes/run1",
			status: 200, fields: map[string]any{"network": nil, "allowInternetAccess": nil}},
	} {
		t.Run(c.name, c.run)
	}
}
