package e2e

import (
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// The restarts TestRestartsUnnoticed injects, one at a time.
const (
	restartNodeKill = "node kill -9"
	restartNodeTerm = "node SIGTERM"
	restartServer   = "server kill -9"
	restartRouter   = "router kill -9"
)

// TestRestartsUnnoticed runs an installation of processes (two `torpor
// server` replicas on PostgreSQL behind a load balancer, one `torpor node`
// on gVisor, two `torpor router`s that clients alternate between, trying
// the other on a refused connection, as a load balancer does) under
// traffic, and restarts its parts one at a time, each back well within
// the heartbeat timeout: the node agent (kill -9, and SIGTERM as an
// upgrade does), a server replica (kill -9) and the first router (kill
// -9). Traffic: two counters under steady requests, one that idles into
// SUSPENDED and one into PAUSED between requests (so requests resume them
// through the control plane while it restarts), and, through the second
// router, a keep-alive connection, a CONNECT tunnel and a streaming
// response to a fourth counter. What a client may see (issue 29): no
// failed request but those a killed router cut mid-way, no cut connection
// on a node agent's restart, no crash, no rollback (every count goes on).
//
// TORPOR_RESTARTS_FAULTS makes a longer run (default 8: each kind twice).
func TestRestartsUnnoticed(t *testing.T) {
	runtimetest.RequireRoot(t)
	rounds := max(1, envInt(t, "TORPOR_RESTARTS_FAULTS", 8)/4)
	cur := torporBinary(t)
	in := installVersion(t, versions{server: cur, node: cur, router: cur})
	c := in.c
	c.applyTemplate(counterTemplate(t, "counter", nil))
	idle := func(action torporv1.IdleAction) func(*torporv1.TemplateSpec) {
		return func(s *torporv1.TemplateSpec) {
			s.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 1, Action: action}
		}
	}
	c.applyTemplate(counterTemplate(t, "suspender", idle(torporv1.IdleAction_IDLE_ACTION_SUSPEND)))
	c.applyTemplate(counterTemplate(t, "pauser", idle(torporv1.IdleAction_IDLE_ACTION_PAUSE)))
	for name, template := range map[string]string{"busy1": "counter", "busy2": "counter", "long": "counter", "sleeper": "suspender", "napper": "pauser"} {
		c.createActor(name, template)
	}

	// The long-lived connections go through the router never killed.
	c.ingress = "http://" + in.routers.procs[1].addr
	c.mustResume("long")
	keepAlive, dials := countingClient()
	defer keepAlive.CloseIdleConnections()
	tunnel := openTunnel(t, c, "long", 8080)
	defer tunnel.Close()
	stream := openStream(t, c, "long")
	defer stream.close()
	longCount := 0
	checkLong := func(when string) {
		t.Helper()
		stream.ticking(t, when)
		for _, got := range []string{routedCount(t, keepAlive, c, "long"), tunnel.get(t)} {
			var n int
			if _, err := fmt.Sscanf(got, "count=%d", &n); err != nil || n != longCount+1 {
				t.Fatalf("%s: long answered %q on a long-lived connection, want count=%d", when, got, longCount+1)
			}
			longCount = n
		}
		if n := dials.Load(); n != 1 {
			t.Fatalf("%s: the keep-alive client dialled %d connections, want its first one only", when, n)
		}
	}
	checkLong("before any restart")

	tr := startTrafficWithGaps(t, in.routers, map[string]int{"busy1": 0, "busy2": 0, "sleeper": 0, "napper": 0},
		map[string]time.Duration{"sleeper": 2500 * time.Millisecond, "napper": 2500 * time.Millisecond})
	tr.enter("before any restart")
	time.Sleep(3 * time.Second)

	kinds := []string{restartNodeKill, restartNodeTerm, restartServer, restartRouter}
	injected := map[string]int{}
	var downs []time.Duration
	for round := range rounds {
		mrand.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		for _, kind := range kinds {
			// Down for 0.8-3 s: well within the heartbeat timeout.
			down := 800*time.Millisecond + time.Duration(mrand.Int64N(int64(2200*time.Millisecond)))
			tr.enter(kind)
			start := time.Now()
			switch kind {
			case restartNodeKill:
				in.node.kill()
				time.Sleep(down)
				in.node.restart(c)
			case restartNodeTerm:
				stopNodeProcess(t, in.node.process)
				time.Sleep(down)
				in.node.restart(c)
			case restartServer:
				r := in.servers[round%len(in.servers)]
				r.p.kill()
				time.Sleep(down)
				r.p, _ = serverProcessOf(t, cur, r.dir, r.addr, r.args...)
			case restartRouter:
				r := in.routers.procs[0]
				tr.mayCut.Store(true)
				r.p.kill()
				time.Sleep(down)
				r.p = startProcessOf(t, cur, "router-"+r.addr+"-again", r.args...)
				r.waitListening(t)
				tr.mayCut.Store(false)
			}
			injected[kind]++
			downs = append(downs, down)
			t.Logf("%s: down %s, serving again after %s", kind, down.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
			checkLong("after " + kind)
			tr.enter("after " + kind)
			time.Sleep(2 * time.Second)
		}
	}
	tr.enter("after the restarts")
	time.Sleep(3 * time.Second)
	tr.stop()
	checkLong("after the restarts")

	resumes := map[string]int{}
	for _, name := range []string{"busy1", "busy2", "long", "sleeper", "napper"} {
		for _, e := range c.events(name) {
			switch e.GetToState() {
			case torporv1.ActorState_ACTOR_STATE_CRASHED:
				t.Errorf("actor %s CRASHED: %s", name, e.GetReason())
			case torporv1.ActorState_ACTOR_STATE_RESUMING:
				resumes[name]++
			}
		}
	}
	// The idlers' requests went through the control plane (a resume each)
	// all along, not only before the first restart.
	for _, name := range []string{"sleeper", "napper"} {
		if resumes[name] < 4*rounds {
			t.Errorf("%s was resumed %d times, want at least %d: it did not idle between requests", name, resumes[name], 4*rounds)
		}
	}
	t.Logf("resumes by requests: sleeper %d, napper %d", resumes["sleeper"], resumes["napper"])
	c.checkReciprocal()
	var kindsSeen []string
	for _, k := range slices.Sorted(maps.Keys(injected)) {
		kindsSeen = append(kindsSeen, fmt.Sprintf("%s ×%d", k, injected[k]))
	}
	t.Logf("restarts: %s; each down %s–%s", strings.Join(kindsSeen, ", "), slices.Min(downs).Round(time.Millisecond), slices.Max(downs).Round(time.Millisecond))
	tr.report()
	in.stop(t)
}
