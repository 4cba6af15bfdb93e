package e2e

import (
	"context"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// upgradeHeartbeatTimeout is the servers': longer than a node agent's
// restart, so the upgrade of one loses no node.
const upgradeHeartbeatTimeout = 15 * time.Second

// TestRollingUpgrade upgrades a running installation from previousVersion
// to this checkout, one part at a time, with traffic running: two `torpor
// server` replicas on one PostgreSQL database behind a TCP load balancer,
// one `torpor node` on gVisor, two `torpor router`s that the client
// alternates between (trying the other one on a refused connection, as a
// load balancer does). The order is the documented one
// (docs/operations.md, "Upgrades"): the server replicas one at a time (the
// first new one migrates the schema while the other, old, serves on),
// then the routers one at a time, then the node agent, which adopts the
// running sandboxes. Throughout, every answer of the counters under
// traffic is the previous count + 1 and no request fails; afterwards the
// actors left suspended (a snapshot of the old node) and paused (a local
// checkpoint of the old node) go on from their counts, and suspend, pause
// and resume work.
func TestRollingUpgrade(t *testing.T) {
	runtimetest.RequireRoot(t)
	old, cur := previousTorpor(t), torporBinary(t)
	in := installVersion(t, versions{server: old, node: old, router: old})
	c := in.c
	c.applyTemplate(counterTemplate(t, "counter", nil))
	for _, name := range []string{"u1", "u2", "u3", "u4", "u5"} {
		c.createActor(name, "counter")
	}
	ctx := context.Background()
	counts := map[string]int{}
	// u1 and u2 run under traffic; u3 is left SUSPENDED and u4 PAUSED by
	// the old version, each with a count of 2.
	for _, name := range []string{"u1", "u2", "u3", "u4"} {
		c.mustResume(name)
		for range 2 {
			counts[name] = in.routers.count(ctx, t, name, counts[name])
		}
	}
	c.suspend("u3")
	c.pause("u4")

	tr := startTraffic(t, in.routers, map[string]int{"u1": counts["u1"], "u2": counts["u2"]})
	tr.enter("old")
	time.Sleep(2 * time.Second)

	tr.enter("server 1 upgraded")
	in.servers[0].upgrade(t, cur)
	time.Sleep(time.Second)
	// The old replica serves on a schema the new one migrated: it starts
	// u5 on the old node, which the new replica suspends.
	oldAPI, newAPI := in.servers[1].cluster(t), in.servers[0].cluster(t)
	oldAPI.mustResume("u5")
	counts["u5"] = in.routers.count(ctx, t, "u5", 0)
	if st := newAPI.suspend("u5").GetStatus(); st.GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("u5 suspended by the new replica: %v", st)
	}
	tr.enter("server 2 upgraded")
	in.servers[1].upgrade(t, cur)
	time.Sleep(time.Second)
	for i, r := range in.routers.procs {
		tr.enter(fmt.Sprintf("router %d upgraded", i+1))
		r.upgrade(t, cur)
		time.Sleep(time.Second)
	}
	tr.enter("node upgraded")
	in.node.upgrade(t, c, cur)
	time.Sleep(2 * time.Second)
	tr.enter("new")
	time.Sleep(time.Second)
	for name, n := range tr.stop() {
		counts[name] = n
	}

	// What the old version left goes on: u3 from the old node's snapshot,
	// u4 from its local checkpoint, u5 from the snapshot of the old node
	// that the new server took.
	for _, name := range []string{"u3", "u4", "u5"} {
		c.mustResume(name)
		counts[name] = in.routers.count(ctx, t, name, counts[name])
	}
	// And the new version's steps work on actors the old one started.
	c.suspend("u1")
	c.pause("u2")
	for _, name := range []string{"u1", "u2"} {
		c.mustResume(name)
		counts[name] = in.routers.count(ctx, t, name, counts[name])
	}
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		for _, e := range c.events(name) {
			if e.GetToState() == torporv1.ActorState_ACTOR_STATE_CRASHED {
				t.Errorf("actor %s CRASHED: %s", name, e.GetReason())
			}
		}
	}
	c.checkReciprocal()
	tr.report()
	in.stop(t)
}

// versionedInstall is an installation whose parts are upgraded one at a
// time: server replicas behind a load balancer, a node agent, routers.
type versionedInstall struct {
	c       *cluster // the API through the load balancer
	servers []*replica
	node    *nodeProcess
	routers *routerPair
}

// versions are the torpor binaries an installation's parts run.
type versions struct{ server, node, router string }

// installVersion starts an installation of v: two server replicas on one
// PostgreSQL database behind a load balancer, one node agent of six
// workers and two routers, each of them talking to the servers through the
// load balancer.
func installVersion(t *testing.T, v versions) *versionedInstall {
	t.Helper()
	snapshots := filepath.Join(t.TempDir(), "snapshots")
	args := []string{"--store", storetest.URL(t, "postgres"), "--snapshots", snapshots, "--heartbeat-timeout", upgradeHeartbeatTimeout.String()}
	in := &versionedInstall{}
	var conn client.Connection
	// The first replica creates the CA and the admin token; the second
	// finds them in the store.
	for range 2 {
		r := &replica{dir: t.TempDir(), addr: testkit.FreeAddr(t), args: args}
		r.p, conn = serverProcessOf(t, v.server, r.dir, r.addr, args...)
		in.servers = append(in.servers, r)
	}
	lb := startBalancer(t, in.servers[0].addr, in.servers[1].addr)
	conn.Server = "https://" + lb.addr()
	in.c = apiCluster(t, conn)
	in.c.snapshotStorage = snapshots
	name := "up-" + randomHex(3)
	token, fingerprint := in.c.joinToken(name)
	in.node = in.c.startNodeProcessOf(v.node, name, 6, "--join-token", token, "--ca-fingerprint", fingerprint)
	in.routers = startRouters(t, in.c, v.router, 2)
	return in
}

// stop stops routers, node and servers with SIGTERM: each exits 0.
func (in *versionedInstall) stop(t *testing.T) {
	t.Helper()
	for _, r := range in.routers.procs {
		stopNodeProcess(t, r.p)
	}
	stopNodeProcess(t, in.node.process)
	for _, r := range in.servers {
		stopNodeProcess(t, r.p)
	}
}

// replica is one `torpor server` process; an upgrade restarts it on the
// same address, directory and store.
type replica struct {
	dir, addr string
	args      []string
	p         *process
}

// upgrade stops the replica (SIGTERM: it drains) and starts bin in its
// place.
func (r *replica) upgrade(t *testing.T, bin string) {
	t.Helper()
	stopNodeProcess(t, r.p)
	r.p, _ = serverProcessOf(t, bin, r.dir, r.addr, r.args...)
}

// cluster is the API of this replica alone.
func (r *replica) cluster(t *testing.T) *cluster {
	t.Helper()
	conn := client.Connection{Server: "https://" + r.addr}
	if err := r.p.serving(&conn, filepath.Join(r.dir, "admin-token"), filepath.Join(r.dir, "ca.pem")); err != nil {
		t.Fatal(err)
	}
	return apiCluster(t, conn)
}

// upgrade stops the node agent (SIGTERM: its running sandboxes stay) and
// starts bin on the same state directory, which adopts them.
func (n *nodeProcess) upgrade(t *testing.T, c *cluster, bin string) {
	t.Helper()
	stopNodeProcess(t, n.process)
	since := time.Now()
	n.bin = bin
	n.process = startProcessOf(t, bin, "node-"+n.name+"-upgraded", n.args...)
	n.waitForHeartbeat(c, since)
}

// routerProcess is one `torpor router`; an upgrade restarts it on the
// same address and state directory (its saved certificate).
type routerProcess struct {
	addr string
	args []string
	p    *process
}

func (r *routerProcess) upgrade(t *testing.T, bin string) {
	t.Helper()
	stopNodeProcess(t, r.p)
	r.p = startProcessOf(t, bin, "router-"+r.addr, r.args...)
	r.waitListening(t)
}

func (r *routerProcess) waitListening(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := net.Dial("tcp", r.addr)
		if err == nil {
			conn.Close()
			return
		}
		if !r.p.running() {
			t.Fatalf("torpor router on %s exited:\n%s", r.addr, tail(r.p.logPath, 4<<10))
		}
		if time.Now().After(deadline) {
			t.Fatalf("torpor router did not listen on %s within a minute", r.addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
