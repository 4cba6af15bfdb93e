package e2e

import (
	"net/http"
	"net/url"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/netns/netnstest"
)

// TestWorkloadEgress: an actor in gVisor reaches a host beyond its node,
// seen as the node (masqueraded), and keeps doing so after a suspend and
// resume (the restored sandbox routes as the booted one did).
func TestWorkloadEgress(t *testing.T) {
	outside := netnstest.Outside(t)
	c := newCluster(t, clusterOptions{backend: "sqlite", egress: true})
	// A template reaches nothing beyond its node unless its policy says
	// so (docs/templates.md): this one allows every public address.
	c.applyTemplate(counterTemplate(t, "counter", func(s *torporv1.TemplateSpec) {
		s.Egress = &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOW}
	}))
	c.createActor("c1", "counter")
	dial := func() (int, string) {
		t.Helper()
		code, _, body := c.routerGetPath("c1", "/dial?addr="+url.QueryEscape(outside.Addr()))
		return code, body
	}
	if code, body := dial(); code != http.StatusOK || body != outside.NodeIP {
		t.Fatalf("c1 dials %s: %d %q, want to be seen as the node, %s", outside.Addr(), code, body, outside.NodeIP)
	}
	c.suspend("c1")
	if code, body := dial(); code != http.StatusOK || body != outside.NodeIP {
		t.Fatalf("c1 dials %s after a resume: %d %q, want %s", outside.Addr(), code, body, outside.NodeIP)
	}
}
