package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/gateproc"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/node"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/fake"
	"github.com/torpor-dev/torpor/internal/runtime/gvisor"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// TestNodeKilledCrashesActor kills a node agent process (SIGKILL) under a
// running actor: the control plane must see the node go silent, make the
// actor CRASHED and free its worker, and the next resume must bring the
// actor back on another node from its latest durable snapshot.
func TestNodeKilledCrashesActor(t *testing.T) {
	// `torpor node` heartbeats every 3 s; twice that tolerates one late
	// heartbeat without calling a live node lost.
	const heartbeatTimeout = 6 * time.Second
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1, heartbeatTimeout: heartbeatTimeout})
	local := c.nodes[0]
	remote := c.startNodeProcess(1)
	c.applyTemplate(counterTemplate(t, "counter", nil))

	holder := c.holdWorkerOf(local.name, "counter")
	c.createActor("c1", "counter")
	onRemote := func(step string, a *torporv1.Actor) *torporv1.Actor {
		t.Helper()
		if n := a.GetStatus().GetWorker().GetNode(); n != remote.name {
			t.Fatalf("%s: c1 runs on node %q, want the agent process's node %s", step, n, remote.name)
		}
		return a
	}
	a := onRemote("first resume", c.mustResume("c1"))
	for i := 1; i <= 3; i++ {
		if got, want := get(t, a), fmt.Sprintf("count=%d lines=%d", i, i); got != want {
			t.Fatalf("request %d: %q, want %q", i, got, want)
		}
	}
	latest := c.suspend("c1").GetStatus().GetLatestSnapshot()
	if latest == "" {
		t.Fatal("suspend recorded no snapshot")
	}
	a = onRemote("resume after suspend", c.mustResume("c1"))
	if got := get(t, a); got != "count=4 lines=4" {
		t.Fatalf("after suspend and resume: %q, want count=4 lines=4", got)
	}

	remote.kill()
	killed := time.Now()
	var crashed *torporv1.Actor
	c.waitFor("c1 to crash after its node was killed", func() bool {
		crashed = c.actor("c1")
		return crashed.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_CRASHED
	})
	t.Logf("c1 CRASHED %s after its node was killed (heartbeat timeout %s)", time.Since(killed).Round(time.Millisecond), heartbeatTimeout)
	st := crashed.GetStatus()
	if !strings.Contains(st.GetCrashReason(), remote.name) {
		t.Errorf("crash reason %q does not name node %s", st.GetCrashReason(), remote.name)
	}
	if st.GetWorker() != nil || st.GetOperation() != nil {
		t.Errorf("crashed actor still holds a worker or an operation: %v", st)
	}
	if st.GetLatestSnapshot() != latest {
		t.Errorf("crash changed the latest snapshot to %q, want %s", st.GetLatestSnapshot(), latest)
	}
	if w := c.worker(a.GetStatus().GetWorker()); w.GetStatus().GetActor() != nil {
		t.Errorf("worker %s of the dead node still names %v", w.GetMetadata().GetName(), w.GetStatus().GetActor())
	}
	c.checkReciprocal()

	// Free the live node's worker: the resume can only land there.
	c.suspend(holder)
	back := c.mustResume("c1")
	if n := back.GetStatus().GetWorker().GetNode(); n != local.name {
		t.Fatalf("resume after the crash ran on node %q, want %s", n, local.name)
	}
	if got := get(t, back); got != "count=4 lines=4" {
		t.Fatalf("after the crash: %q, want count=4 lines=4 (snapshot %s held count=3 lines=3)", got, latest)
	}
	events := c.events("c1")
	if r := events[len(events)-2].GetReason(); !strings.Contains(r, "FULL from") || !strings.Contains(r, latest) {
		t.Errorf("resume after the crash: %q, want FULL from snapshot %s", r, latest)
	}
	c.checkReciprocal()

	// The lost node comes back with c1's old workload still in its
	// sandbox. c1 runs elsewhere now: the node must drop that workload,
	// and its worker must take new actors.
	remote.restart(c)
	c.createActor("c2", "counter")
	c2 := c.mustResume("c2")
	if n := c2.GetStatus().GetWorker().GetNode(); n != remote.name {
		t.Fatalf("c2 runs on node %q, want the returned node %s (the only free worker)", n, remote.name)
	}
	if got := get(t, c2); got != "count=1 lines=1" {
		t.Fatalf("c2 on the returned node: %q, want count=1 lines=1", got)
	}
	if got := get(t, back); got != "count=5 lines=5" {
		t.Fatalf("c1 after its old node returned: %q, want count=5 lines=5", got)
	}
	c.checkReciprocal()

	// Frozen (as in a paused VM), the node is lost too, and its agent does
	// not notice: when it thaws, it must still learn that c2 moved on.
	remote.signal(t, syscall.SIGSTOP)
	c.waitFor("c2 to crash while its node is frozen", func() bool {
		return c.actor("c2").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_CRASHED
	})
	remote.signal(t, syscall.SIGCONT)
	remote.waitForHeartbeat(c, time.Now())
	c2 = c.mustResume("c2")
	if n := c2.GetStatus().GetWorker().GetNode(); n != remote.name {
		t.Fatalf("c2 resumed on node %q, want the thawed node %s (the only free worker)", n, remote.name)
	}
	if got := get(t, c2); got != "count=1 lines=1" {
		t.Fatalf("c2 after its node thawed: %q, want count=1 lines=1 (it has no snapshot)", got)
	}
	c.checkReciprocal()
	remote.removeLeftovers(t)
}

// TestServerKilledMidWorkflow kills the control plane process (SIGKILL)
// while a node call of a resume or suspend is in flight, lets the node
// finish, and starts a new control plane on the same store: it must find
// the step in flight and finish it with the node's recorded outcome,
// without running the workload again and with placement reciprocal
// (invariants 1 and 3).
func TestServerKilledMidWorkflow(t *testing.T) {
	tests := []struct {
		name string
		// prepare brings a1 to where the step starts.
		prepare func(t *testing.T, c *cluster, rt *fake.Runtime, slot string)
		// method is the runtime call the node is held in when the
		// control plane dies.
		method string
		step   func(c *cluster) error
		during torporv1.ActorState
		// check looks at a1 once nothing is in flight; calls are the
		// runtime calls since the step began.
		check func(t *testing.T, c *cluster, rt *fake.Runtime, slot string, calls []fake.Call)
	}{{
		name:    "resume",
		prepare: func(*testing.T, *cluster, *fake.Runtime, string) {},
		method:  "Restore",
		step: func(c *cluster) error {
			_, err := c.resume("a1", nil)
			return err
		},
		during: torporv1.ActorState_ACTOR_STATE_RESUMING,
		check: func(t *testing.T, c *cluster, rt *fake.Runtime, slot string, calls []fake.Call) {
			a := c.actor("a1")
			if st := a.GetStatus(); st.GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING || st.GetWorker().GetName() != slot {
				t.Fatalf("after the restart: %v, want RUNNING on %s", st, slot)
			}
			uid := a.GetMetadata().GetUid()
			if n := startsOf(calls, uid); n != 1 {
				t.Errorf("the workload was started %d times, want once: %v", n, calls)
			}
			if got, ok := rt.Workload(slot); !ok || got != uid {
				t.Errorf("worker %s runs %q, want actor %s", slot, got, uid)
			}
			if n, err := rt.Touch(slot); err != nil || n != 1 {
				t.Errorf("first request after the restore: counter %d (%v), want 1", n, err)
			}
		},
	}, {
		name: "suspend",
		prepare: func(t *testing.T, c *cluster, rt *fake.Runtime, slot string) {
			c.mustResume("a1")
			for range 2 {
				if _, err := rt.Touch(slot); err != nil {
					t.Fatal(err)
				}
			}
		},
		method: "Checkpoint",
		step: func(c *cluster) error {
			_, err := c.actors.SuspendActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "a1"}))
			return err
		},
		during: torporv1.ActorState_ACTOR_STATE_SUSPENDING,
		check: func(t *testing.T, c *cluster, rt *fake.Runtime, slot string, calls []fake.Call) {
			// The node finished the checkpoint, so the snapshot exists
			// and the workload is gone: anything but SUSPENDED with that
			// snapshot would lose state or claim a workload that is not
			// running.
			st := c.actor("a1").GetStatus()
			if st.GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED || st.GetWorker() != nil || st.GetLatestSnapshot() == "" {
				t.Fatalf("after the restart: %v, want SUSPENDED with a snapshot and no worker", st)
			}
			if _, err := c.snapshots.GetSnapshot(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: st.GetLatestSnapshot()})); err != nil {
				t.Fatalf("snapshot %s: %v", st.GetLatestSnapshot(), err)
			}
			if n := countCalls(calls, "Checkpoint", slot); n != 1 {
				t.Errorf("%d checkpoints of %s, want 1: %v", n, slot, calls)
			}
			if got, ok := rt.Workload(slot); ok {
				t.Errorf("worker %s still runs %s after the suspend", slot, got)
			}
			c.mustResume("a1")
			if n, err := rt.Touch(slot); err != nil || n != 3 {
				t.Errorf("first request after resuming the snapshot: counter %d (%v), want 3", n, err)
			}
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			addr := testkit.FreeAddr(t)
			snapshots := filepath.Join(dir, "snapshots")
			args := []string{"--store", "sqlite:" + filepath.Join(dir, "torpor.db"), "--snapshots", snapshots, "--recover-after", "1m"}
			srv, conn := serverProcess(t, dir, addr, args...)
			c := apiCluster(t, conn)
			rt := fake.New()
			nodeName := "e2f-" + randomHex(3)
			startFakeNode(t, c, nodeName, rt, snapshots)
			slot := node.WorkerName(nodeName, 0)
			c.waitForWorkers(nodeName, 1)
			// No readiness probe: nothing listens behind the fake.
			c.applyTemplate(counterTemplate(t, "counter", func(s *torporv1.TemplateSpec) { s.Containers[0].ReadinessProbe = nil }))
			c.createActor("a1", "counter")
			tc.prepare(t, c, rt, slot)

			from := len(rt.Calls())
			release := rt.Hang(tc.method)
			t.Cleanup(release) // before the node stops: it waits for its operations
			stepDone := make(chan error, 1)
			go func() { stepDone <- tc.step(c) }()
			c.waitFor(fmt.Sprintf("a1 %s with the node in %s", tc.during, tc.method), func() bool {
				return c.actor("a1").GetStatus().GetState() == tc.during && countCalls(rt.Calls()[from:], tc.method, slot) > 0
			})
			srv.kill()
			if err := <-stepDone; err == nil {
				t.Fatalf("%s answered although the node was still in %s", tc.name, tc.method)
			}
			release()

			serverProcess(t, dir, addr, args...)
			c.waitFor("no actor in flight after the restart", func() bool {
				return !slices.ContainsFunc(c.listActors(), func(a *torporv1.Actor) bool { return inFlight(a.GetStatus().GetState()) })
			})
			tc.check(t, c, rt, slot, rt.Calls()[from:])
			c.checkReciprocal()
		})
	}
}

// TestTamperedSnapshot corrupts one object of an actor's latest snapshot
// in snapshot storage: the resume must fail with DataLoss naming the file,
// leave the actor CRASHED (not stuck, not running on older state), and
// the earlier snapshot must still restore when asked for by name.
func TestTamperedSnapshot(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", nodes: 2, workersPerNode: 1})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")

	a := c.mustResume("c1")
	get(t, a)
	if got := get(t, a); got != "count=2 lines=2" {
		t.Fatalf("second request: %q, want count=2 lines=2", got)
	}
	earlier := c.suspend("c1").GetStatus().GetLatestSnapshot()
	a = c.mustResume("c1")
	if got := get(t, a); got != "count=3 lines=3" {
		t.Fatalf("after the first suspend: %q, want count=3 lines=3", got)
	}
	latest := c.suspend("c1").GetStatus().GetLatestSnapshot()
	if earlier == "" || latest == "" || earlier == latest {
		t.Fatalf("snapshots %q and %q, want two", earlier, latest)
	}
	// The node that took the snapshot restores it from its own cache; the
	// other one reads it from storage, where it is corrupted.
	c.holdWorkerOf(a.GetStatus().GetWorker().GetNode(), "counter")
	file, chunk := tamperSnapshot(t, c, latest)

	_, err := c.resume("c1", nil)
	if connect.CodeOf(err) != connect.CodeDataLoss {
		t.Fatalf("resume from the tampered snapshot: %v, want DataLoss", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "file "+file) || !strings.Contains(msg, "chunk "+chunk) {
		t.Errorf("error %q does not name file %s and chunk %s", msg, file, chunk)
	}
	st := c.actor("c1").GetStatus()
	if st.GetState() != torporv1.ActorState_ACTOR_STATE_CRASHED || st.GetWorker() != nil {
		t.Fatalf("after the failed resume: %v, want CRASHED without a worker", st)
	}
	if !strings.Contains(st.GetCrashReason(), file) {
		t.Errorf("crash reason %q does not name file %s", st.GetCrashReason(), file)
	}
	if st.GetLatestSnapshot() != latest {
		t.Errorf("the failed resume moved the latest snapshot to %q, want %s", st.GetLatestSnapshot(), latest)
	}
	c.checkReciprocal()

	back, err := c.resume("c1", &torporv1.ResumeActorRequest{Snapshot: earlier})
	if err != nil {
		t.Fatalf("resume from the earlier snapshot %s: %v", earlier, err)
	}
	if got := get(t, back); got != "count=3 lines=3" {
		t.Fatalf("from the earlier snapshot: %q, want count=3 lines=3 (it held count=2 lines=2)", got)
	}
	c.checkReciprocal()
}

// holdWorkerOf makes a fresh actor of template occupy a worker of node, so
// that the next resume lands elsewhere, and returns its name. Actors that
// landed on other nodes on the way are suspended again.
func (c *cluster) holdWorkerOf(node, template string) string {
	c.t.Helper()
	var elsewhere []string
	for i := range 8 {
		name := fmt.Sprintf("holder-%s-%d", node, i)
		c.createActor(name, template)
		if c.mustResume(name).GetStatus().GetWorker().GetNode() != node {
			elsewhere = append(elsewhere, name)
			continue
		}
		for _, other := range elsewhere {
			c.suspend(other)
		}
		return name
	}
	c.t.Fatalf("no free worker of node %s taken after %d resumes", node, len(elsewhere))
	return ""
}

// tamperSnapshot flips a byte in a stored chunk of the volume archive of
// snapshot name, and returns the file's path in the snapshot and the
// chunk's hash.
func tamperSnapshot(t testing.TB, c *cluster, name string) (file, chunk string) {
	t.Helper()
	resp, err := c.snapshots.GetSnapshot(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: name}))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(c.snapshotStorage, filepath.FromSlash(resp.Msg.GetLocation())) // a directory: the cluster has no s3
	body, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m snapshot.Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("manifest of snapshot %s: %v", name, err)
	}
	const archive = "data.tar" // the durable volumes
	i := slices.IndexFunc(m.Entries, func(e snapshot.Entry) bool { return e.Path == archive })
	if i < 0 {
		t.Fatalf("snapshot %s has no %s: %v", name, archive, m.Entries)
	}
	chunks := m.Entries[i].Chunks
	if len(chunks) == 0 {
		t.Fatalf("snapshot %s: %s has no chunks (manifest version %d)", name, archive, m.Version)
	}
	// Chunks are shared by content; the last one of the volumes' archive
	// holds the newest lines, so no earlier snapshot names it.
	last := chunks[len(chunks)-1]
	path := filepath.Join(c.snapshotStorage, filepath.FromSlash(last.Key()))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return archive, last.SHA256
}

func inFlight(s torporv1.ActorState) bool {
	switch s {
	case torporv1.ActorState_ACTOR_STATE_RESUMING, torporv1.ActorState_ACTOR_STATE_SUSPENDING,
		torporv1.ActorState_ACTOR_STATE_PAUSING, torporv1.ActorState_ACTOR_STATE_DELETING:
		return true
	}
	return false
}

// startsOf counts the runtime calls that started actorUID's workload.
func startsOf(calls []fake.Call, actorUID string) int {
	n := 0
	for _, c := range calls {
		if (c.Method == "Run" || c.Method == "Restore") && c.ActorUID == actorUID {
			n++
		}
	}
	return n
}

func countCalls(calls []fake.Call, method, slot string) int {
	n := 0
	for _, c := range calls {
		if c.Method == method && c.Slot == slot {
			n++
		}
	}
	return n
}

// loopbackNetwork gives every slot the host's loopback address: the fake
// runtime's workloads listen nowhere.
type loopbackNetwork struct{}

func (loopbackNetwork) Slot(_ context.Context, name string, _ int) (runtime.Slot, error) {
	return runtime.Slot{Name: name, IP: "127.0.0.1"}, nil
}

// startFakeNode runs an in-process node agent with one worker on the fake
// runtime until the test ends.
func startFakeNode(t testing.TB, c *cluster, name string, rt *fake.Runtime, snapshots string) {
	t.Helper()
	token, fingerprint := c.joinToken(name)
	objects, err := snapshot.NewDirStore(snapshots)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	agent, err := node.New(node.Config{
		Name: name, ServerURL: c.api, Listener: ln, Workers: 1, Pool: "default",
		StateDir: t.TempDir(), Runtime: rt, Snapshots: objects, Network: loopbackNetwork{},
		CAFingerprint: fingerprint, JoinToken: func(context.Context) (string, error) { return token, nil },
		HeartbeatInterval: 200 * time.Millisecond, Logger: testLogger(), Images: runtimetest.ImagePolicy(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := agent.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("node agent %s: %v", name, err)
		}
	}()
	t.Cleanup(func() {
		stop()
		<-done
	})
}

// nodeProcess is `torpor node` on real gVisor as a child process.
type nodeProcess struct {
	*process
	// bin is the torpor binary it runs (and a restart runs).
	bin      string
	name     string
	args     []string
	stateDir string
	workers  int
	network  netns.Config
	cleaned  sync.Once
}

// startNodeProcess starts a node agent process with its own bridge and
// subnet (outside the range addNode draws from) and waits until its
// workers are registered.
func (c *cluster) startNodeProcess(workers int) *nodeProcess {
	c.t.Helper()
	name := "e2p-" + randomHex(3)
	// The token joins the first start only: a restart (same arguments)
	// must use the certificate the node saved.
	token, fingerprint := c.joinToken(name)
	return c.startNodeProcessAs(name, workers, "--join-token", token, "--ca-fingerprint", fingerprint)
}

// startNodeProcessAs starts node agent name with the join arguments
// given (a join token, or a Kubernetes token file) and waits until its
// workers are registered.
func (c *cluster) startNodeProcessAs(name string, workers int, join ...string) *nodeProcess {
	c.t.Helper()
	return c.startNodeProcessOf(torporBinary(c.t), name, workers, join...)
}

// startNodeProcessOf is startNodeProcessAs running bin.
func (c *cluster) startNodeProcessOf(bin, name string, workers int, join ...string) *nodeProcess {
	t := c.t
	t.Helper()
	suffix := randomHex(3)
	n := &nodeProcess{
		bin: bin, name: name, stateDir: shortTempDir(t), workers: workers,
		network: netns.Config{Node: name, Bridge: "tp" + suffix, CIDR: fmt.Sprintf("10.%d.%d.0/24", 248+mrand.IntN(4), mrand.IntN(256))},
	}
	n.args = append([]string{"node",
		"--server", c.api, "--name", n.name, "--workers", strconv.Itoa(workers),
		"--listen", testkit.FreeAddr(t), "--state-dir", n.stateDir, "--snapshots", c.snapshotStorage,
		"--bridge", n.network.Bridge, "--cidr", n.network.CIDR, "--runsc", runtimetest.Runsc(t)}, join...)
	n.args = append(n.args, allowExamples(t)...)
	n.process = startProcessOf(t, bin, "node-"+n.name, n.args...)
	t.Cleanup(func() { n.removeLeftovers(t) })
	c.waitForWorkers(n.name, workers)
	return n
}

// restart starts the agent again on its state directory, as after a
// reboot, and waits until it heartbeats.
func (n *nodeProcess) restart(c *cluster) {
	c.t.Helper()
	n.kill()
	since := time.Now()
	n.process = startProcessOf(c.t, n.bin, "node-"+n.name+"-again", n.args...)
	n.waitForHeartbeat(c, since)
}

// waitForHeartbeat waits until the node heartbeats after since.
func (n *nodeProcess) waitForHeartbeat(c *cluster, since time.Time) {
	c.t.Helper()
	c.waitFor("node "+n.name+" back", func() bool {
		resp, err := c.nodeClient().GetNode(c.ctx, connect.NewRequest(&torporv1.GetRequest{Name: n.name}))
		return err == nil && resp.Msg.GetHeartbeatTime().AsTime().After(since)
	})
}

// removeLeftovers kills the agent and removes what it leaves behind
// (sandboxes, their mounts, the workers' network), then checks that
// nothing of it is left.
func (n *nodeProcess) removeLeftovers(t testing.TB) {
	t.Helper()
	n.cleaned.Do(func() {
		n.kill()
		ctx := context.Background()
		// The slot gate process outlives the agent, as its sandboxes do.
		if _, err := gateproc.StopLeftover(ctx, n.stateDir); err != nil {
			t.Errorf("node %s: %v", n.name, err)
		}
		rt, err := gvisor.New(gvisor.Config{ConfigureNetwork: netns.Configure, Runsc: runtimetest.Runsc(t), RootDir: filepath.Join(n.stateDir, "gvisor")})
		if err != nil {
			t.Errorf("node %s: %v", n.name, err)
			return
		}
		for i := range n.workers {
			if err := rt.Terminate(ctx, runtime.Slot{Name: node.WorkerName(n.name, i)}); err != nil {
				t.Errorf("node %s: %v", n.name, err)
			}
		}
		if err := rt.Close(ctx); err != nil {
			t.Errorf("node %s: %v", n.name, err)
		}
		network, err := netns.New(n.network)
		if err == nil {
			err = network.TeardownAll(ctx)
		}
		if err != nil {
			t.Errorf("node %s: tear down network: %v", n.name, err)
		}

		deadline := time.Now().Add(10 * time.Second)
		for len(processesMentioning(t, n.stateDir)) > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		for _, p := range processesMentioning(t, n.stateDir) {
			t.Errorf("node %s: process left: %s", n.name, p)
		}
		for _, m := range runtimetest.MountsUnder(t, n.stateDir) {
			t.Errorf("node %s: mount left: %s", n.name, m)
		}
		entries, err := os.ReadDir(netns.Dir)
		if err != nil && !os.IsNotExist(err) {
			t.Error(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "torpor-"+n.name+"-") {
				t.Errorf("node %s: network namespace left: %s", n.name, e.Name())
			}
		}
	})
}

// processesMentioning lists the command lines of processes that contain s.
func processesMentioning(t testing.TB, s string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		if line := strings.ReplaceAll(string(cmdline), "\x00", " "); strings.Contains(line, s) {
			out = append(out, e.Name()+": "+line)
		}
	}
	return out
}
