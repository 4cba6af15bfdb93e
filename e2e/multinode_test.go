package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/snapshot/s3test"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// TestMultiNode runs the installation of issue 11's point 5: two `torpor
// server` replicas on one PostgreSQL database, snapshots in S3, two
// `torpor node` processes on this machine, each with its own bridge and
// subnet. Actors run on both nodes and are suspended and resumed through
// either replica. Then one node is killed for good: once the heartbeat
// timeout passes, its actors are CRASHED (a node lost for good takes the
// state it held in memory), and their next resume, through either replica,
// brings them back on the other node from their latest durable snapshots.
func TestMultiNode(t *testing.T) {
	runtimetest.RequireRoot(t)
	// `torpor node` heartbeats every 3 s; twice that tolerates one late
	// heartbeat without calling a live node lost.
	const heartbeatTimeout = 6 * time.Second
	db, snapshots := storetest.URL(t, "postgres"), s3test.Location(t, "torpor")
	replica := func(name string) *cluster {
		t.Helper()
		dir := t.TempDir()
		_, conn := serverProcess(t, dir, testkit.FreeAddr(t), "--store", db, "--snapshots", snapshots, "--heartbeat-timeout", heartbeatTimeout.String())
		c := apiCluster(t, conn)
		c.snapshotStorage = snapshots
		t.Logf("replica %s serves %s", name, c.api)
		return c
	}
	// The first replica creates the CA and the admin token; the second
	// finds them in the store.
	r1 := replica("r1")
	r2 := replica("r2")
	replicas := []*cluster{r1, r2}

	// Each node joins through, and talks to, its own replica.
	nodeA, nodeB := r1.startNodeProcess(2), r2.startNodeProcess(2)
	r1.waitForWorkers(nodeB.name, 2)
	r2.waitForWorkers(nodeA.name, 2)
	r1.applyTemplate(counterTemplate(t, "counter", nil))

	// Four actors on four workers: two on each node. Actor i is resumed
	// through replica i%2 and suspended through the other one.
	names := []string{"m1", "m2", "m3", "m4"}
	running := map[string]*torporv1.Actor{}
	for i, name := range names {
		replicas[i%2].createActor(name, "counter")
	}
	for i, name := range names {
		running[name] = replicas[i%2].mustResume(name)
	}
	for i, name := range names {
		for n := 1; n <= 2; n++ {
			if got, want := get(t, running[name]), fmt.Sprintf("count=%d lines=%d", n, n); got != want {
				t.Fatalf("request %d to %s: %q, want %q", n, name, got, want)
			}
		}
		if st := replicas[(i+1)%2].suspend(name).GetStatus(); st.GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
			t.Fatalf("%s after its suspend through the other replica: %v", name, st)
		}
	}
	// Resumed from the snapshots through the replica that did not take
	// them, the actors go on from them: count 3, only in memory, as their
	// nodes are lost.
	latest := map[string]string{}
	onNode := map[string][]string{}
	for i, name := range names {
		latest[name] = replicas[i%2].actor(name).GetStatus().GetLatestSnapshot()
		a := replicas[(i+1)%2].mustResume(name)
		if got := get(t, a); got != "count=3 lines=3" {
			t.Fatalf("%s resumed through the other replica: %q, want count=3 lines=3", name, got)
		}
		running[name] = a
		node := a.GetStatus().GetWorker().GetNode()
		onNode[node] = append(onNode[node], name)
	}
	if len(onNode[nodeA.name]) != 2 || len(onNode[nodeB.name]) != 2 {
		t.Fatalf("actors by node %v, want two on each of %s and %s", onNode, nodeA.name, nodeB.name)
	}
	for _, c := range replicas {
		c.checkReciprocal()
	}

	lost, kept := onNode[nodeA.name], onNode[nodeB.name]
	nodeA.kill()
	killed := time.Now()
	for _, name := range lost {
		var st *torporv1.ActorStatus
		r2.waitFor(name+" CRASHED after its node was killed for good", func() bool {
			st = r2.actor(name).GetStatus()
			return st.GetState() == torporv1.ActorState_ACTOR_STATE_CRASHED
		})
		t.Logf("%s CRASHED %s after node %s was killed (heartbeat timeout %s)", name, time.Since(killed).Round(time.Millisecond), nodeA.name, heartbeatTimeout)
		if !strings.Contains(st.GetCrashReason(), nodeA.name) {
			t.Errorf("crash reason of %s %q does not name node %s", name, st.GetCrashReason(), nodeA.name)
		}
		if st.GetWorker() != nil || st.GetLatestSnapshot() != latest[name] {
			t.Errorf("%s CRASHED with worker %v and latest snapshot %q, want no worker and %s", name, st.GetWorker(), st.GetLatestSnapshot(), latest[name])
		}
	}
	// The other node's actors never noticed.
	for _, name := range kept {
		if st := r1.actor(name).GetStatus(); st.GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING {
			t.Errorf("%s on the live node %s: %v, want RUNNING", name, nodeB.name, st)
		}
		if got := get(t, running[name]); got != "count=4 lines=4" {
			t.Errorf("%s on the live node: %q, want count=4 lines=4", name, got)
		}
	}
	for _, c := range replicas {
		c.checkReciprocal()
	}

	// The live node's workers are freed (each actor through a replica),
	// then the lost actors resume there, one through each replica, from
	// their latest durable snapshots: count 2 kept, the 3 held only in
	// the lost node's memory gone.
	for i, name := range kept {
		replicas[i].suspend(name)
	}
	for i, name := range lost {
		a := replicas[i].mustResume(name)
		if n := a.GetStatus().GetWorker().GetNode(); n != nodeB.name {
			t.Fatalf("%s resumed on node %q, want the live node %s", name, n, nodeB.name)
		}
		if got := get(t, a); got != "count=3 lines=3" {
			t.Fatalf("%s after its node was lost: %q, want count=3 lines=3 (snapshot %s held count=2 lines=2)", name, got, latest[name])
		}
		events := replicas[i].events(name)
		if r := events[len(events)-2].GetReason(); !strings.Contains(r, "FULL from") || !strings.Contains(r, latest[name]) {
			t.Errorf("resume of %s after the crash: %q, want FULL from snapshot %s", name, r, latest[name])
		}
	}
	// The kept actors' snapshots hold their count too: one of them comes
	// back through the replica that did not suspend it.
	replicas[1].suspend(lost[0])
	if got := get(t, replicas[1].mustResume(kept[0])); got != "count=5 lines=5" {
		t.Errorf("%s resumed after the loss of node %s: %q, want count=5 lines=5", kept[0], nodeA.name, got)
	}
	for _, c := range replicas {
		c.checkReciprocal()
	}
	// The lost node's sandboxes outlived its agent: removed, and checked
	// gone.
	nodeA.removeLeftovers(t)
}
