package e2e

import (
	"context"
	"net/http"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/netns/netnstest"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// TestVersionSkew runs previousVersion beside this checkout both ways
// round, as an upgrade's window does (routers of the servers' version):
// an old server with a new node agent, a new server with an old one. An
// actor goes through resume, suspend, resume, pause and resume with its
// count intact, and reaches a public address as the old version let it:
// an old server names no egress policy, which a new node takes for allow
// (not deny), and an old node knows no policies (its --egress masquerades
// every workload).
func TestVersionSkew(t *testing.T) {
	runtimetest.RequireRoot(t)
	old, cur := previousTorpor(t), torporBinary(t)
	internet := netnstest.NewInternet(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		v    versions
	}{
		{"old server, new node", versions{server: old, node: cur, router: old}},
		{"new server, old node", versions{server: cur, node: old, router: cur}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := installVersion(t, tc.v)
			c := in.c
			c.applyTemplate(counterTemplate(t, "counter", nil))
			c.createActor("s1", "counter")
			count := 0
			for _, step := range []func(string) *torporv1.Actor{c.mustResume, c.suspend, c.mustResume, c.pause, c.mustResume} {
				if st := step("s1").GetStatus().GetState(); st == torporv1.ActorState_ACTOR_STATE_RUNNING {
					count = in.routers.count(ctx, t, "s1", count)
				}
			}
			if count != 3 {
				t.Fatalf("s1 answered %d times, want 3 (after each of its resumes)", count)
			}
			dial := dialPath("tcp", internet.AddrPort(0, 10, 443))
			if code, body, err := in.routers.get(ctx, "s1", dial); err != nil || code != http.StatusOK {
				t.Errorf("s1 %s: %d %q %v, want a public address reached, as before egress policies", dial, code, body, err)
			}
			c.suspend("s1")
			in.stop(t)
		})
	}
}
