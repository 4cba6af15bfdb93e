package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// TestIdleLadderFreezes: the idle ladder's first rung on real gVisor, on
// a node agent run as in production (its own process, the slot gate a
// process of its own). An actor whose template sets freezeSeconds is
// frozen after that long without traffic (status.frozenTime, an event),
// and then uses no CPU although a process in it spins; a request, an
// exec and a tunnel each thaw it with its memory intact; a frozen actor
// outlives a kill -9 of its node agent frozen, and thaws as before; an
// eviction takes the frozen actor before a less recently active one that
// is not frozen; its node lost, it is CRASHED and comes back elsewhere
// from its snapshot as a RUNNING actor would, and the node, back, drops
// the frozen workload; a delete of a frozen actor leaves nothing, and so
// does torpor node --cleanup of a node stopped with one.
func TestIdleLadderFreezes(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1, heartbeatTimeout: 6 * time.Second})
	local := c.nodes[0]
	images := t.TempDir()
	shell := buildShellImage(t, images)
	name := "e2p-" + randomHex(3)
	token, fingerprint := c.joinToken(name)
	remote := c.startNodeProcessAs(name, 2, "--join-token", token, "--ca-fingerprint", fingerprint, "--allow-image-dir", images)
	c.ingress = "http://" + startRouterProcess(t, c, "freeze-router")
	c.applyTemplate(counterTemplate(t, "freezer", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{FreezeSeconds: 2, Eviction: &torporv1.EvictionPolicy{MinIdleSeconds: 1}}
		s.Containers = append(s.Containers, &torporv1.Container{Name: "spinner", Image: shell, Command: []string{"/bin/sh", "-c", "while :; do :; done"}})
	}))
	c.applyTemplate(counterTemplate(t, "plain", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{Eviction: &torporv1.EvictionPolicy{MinIdleSeconds: 1}}
	}))
	holder := c.holdWorkerOf(local.name, "plain")

	// b1 first: the least recently active of the two, and never frozen.
	c.createActor("b1", "plain")
	c.createActor("f1", "freezer")
	if n := c.mustResume("b1").GetStatus().GetWorker().GetNode(); n != remote.name {
		t.Fatalf("b1 runs on node %q, want %s", n, remote.name)
	}
	count := 0
	// lastAnswer is when the last request's answer came: the gate saw
	// its bytes just before, and counts f1's idle time from them.
	var lastAnswer time.Time
	request := func(when string) time.Duration {
		t.Helper()
		count++
		began := time.Now()
		code, _, body := c.routerGet("f1")
		lastAnswer = time.Now()
		took := lastAnswer.Sub(began)
		if want := fmt.Sprintf("count=%d lines=%d", count, count); code != http.StatusOK || body != want {
			t.Fatalf("%s: request %d: %d %q, want %q", when, count, code, body, want)
		}
		return took
	}
	request("first")
	stats := func() *torporv1.ActorStats {
		resp, err := c.actors.GetActorStats(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "f1"}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg
	}
	// CPU over 2 s: awake (a request every half second keeps it so),
	// then frozen.
	cpuOver := func(during func()) float64 {
		before := stats().GetCpuSeconds()
		began := time.Now()
		during()
		return (stats().GetCpuSeconds() - before) / time.Since(began).Seconds()
	}
	awake := cpuOver(func() {
		for range 4 {
			time.Sleep(500 * time.Millisecond)
			request("kept awake")
		}
	})
	// waitFrozen waits for a new freeze: each call follows traffic that
	// thawed f1, whose report may not have reached the control plane
	// yet, so the freeze shown before it does not count.
	var lastFrozen time.Time
	waitFrozen := func(when string) time.Time {
		t.Helper()
		c.waitFor("f1 frozen "+when, func() bool {
			st := c.actor("f1").GetStatus()
			if st.GetFrozenTime() == nil || st.GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING || !st.GetFrozenTime().AsTime().After(lastFrozen) {
				return false
			}
			lastFrozen = st.GetFrozenTime().AsTime()
			return true
		})
		return lastFrozen
	}
	waitThawed := func(when string) {
		t.Helper()
		c.waitFor("f1 shown thawed "+when, func() bool { return c.actor("f1").GetStatus().GetFrozenTime() == nil })
	}
	frozenAt := waitFrozen("after 2s without traffic")
	if idle := frozenAt.Sub(lastAnswer); idle < 2*time.Second-100*time.Millisecond {
		t.Errorf("frozen %s after its last request, before its 2s", idle)
	}
	frozen := cpuOver(func() { time.Sleep(2 * time.Second) })
	t.Logf("CPU used: %.2f of a CPU awake, %.3f frozen", awake, frozen)
	if awake < 0.3 {
		t.Fatalf("the spinning actor used %.2f of a CPU awake: the measure cannot tell frozen from awake", awake)
	}
	if frozen > 0.05 || frozen > awake/20 {
		t.Errorf("the frozen actor used %.3f of a CPU (awake: %.2f)", frozen, awake)
	}
	if st := c.actor("f1").GetStatus(); st.GetFrozenTime() == nil {
		t.Fatal("a stats read thawed f1: reads never wake")
	}

	// Thawed by a request, state intact.
	t.Logf("first byte from a frozen actor through the router: %s", request("thawed by a request"))
	waitThawed("after a request")

	// Thawed by an exec.
	waitFrozen("before the exec")
	if out := c.execOut(t, "f1", "spinner", "/bin/sh", "-c", "echo awake"); out != "awake\n" {
		t.Fatalf("exec in the frozen actor: %q", out)
	}
	waitThawed("after an exec")
	request("after the exec")

	// Thawed by a tunnel (a new connection, and a byte on it later).
	waitFrozen("before the tunnel")
	tunnel := openTunnel(t, c, "f1", 8080)
	defer tunnel.Close()
	count++
	if got := tunnel.get(t); got != fmt.Sprintf("count=%d lines=%d", count, count) {
		t.Fatalf("through a tunnel to the frozen actor: %q", got)
	}
	waitFrozen("with the tunnel open and idle")
	count++
	if got := tunnel.get(t); got != fmt.Sprintf("count=%d lines=%d", count, count) {
		t.Fatalf("through the kept tunnel to the frozen actor: %q", got)
	}
	tunnel.Close()

	// The agent killed and started again while f1 is frozen: f1 stays
	// frozen (the gate process kept it), and thaws as before.
	waitFrozen("before the agent's restart")
	remote.restart(c)
	if st := c.actor("f1").GetStatus(); st.GetFrozenTime() == nil || st.GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("after the agent's restart f1 is %s, frozen since %v", st.GetState(), st.GetFrozenTime())
	}
	request("after the agent's restart")
	waitThawed("after the agent's restart")

	// An eviction takes the frozen actor, though b1 was active before it.
	waitFrozen("before the eviction")
	c.createActor("n1", "plain")
	if n := c.mustResume("n1").GetStatus().GetWorker().GetNode(); n != remote.name {
		t.Fatalf("n1 runs on node %q, want %s", n, remote.name)
	}
	if st := c.actor("f1").GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("f1 is %s after an eviction on its node, want SUSPENDED (frozen first)", st)
	}
	if st := c.actor("b1").GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("b1 is %s, want RUNNING: the eviction took it before the frozen actor", st)
	}
	ev := c.lastEventTo("f1", torporv1.ActorState_ACTOR_STATE_SUSPENDING)
	if !strings.Contains(ev.GetReason(), "frozen") {
		t.Errorf("f1's eviction says %q, want it to name the actor frozen", ev.GetReason())
	}
	var froze, thawed int
	for _, ev := range c.events("f1") {
		froze += boolInt(strings.HasPrefix(ev.GetReason(), "frozen: "))
		thawed += boolInt(strings.HasPrefix(ev.GetReason(), "thawed: "))
	}
	if froze < 5 || thawed < 4 {
		t.Errorf("f1's events: %d freezes and %d thaws, want at least 5 and 4", froze, thawed)
	}

	// Back (a suspend of a frozen actor kept its memory), frozen and
	// suspended, back and frozen again.
	c.suspend("b1")
	request("resumed from the suspend of a frozen actor")
	waitFrozen("before its suspend")
	if st := c.suspend("f1").GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("suspend of the frozen f1: %s", st)
	}
	suspended := count
	request("resumed again")

	// Its node lost while it is frozen: CRASHED as a RUNNING actor would
	// be, back elsewhere from its last snapshot; the node, back, drops
	// the frozen workload.
	waitFrozen("before its node is lost")
	gone := sandboxProcesses(t, c, remote.stateDir, "f1")
	remote.kill()
	c.waitFor("f1 CRASHED with its node lost", func() bool {
		return c.actor("f1").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_CRASHED
	})
	if st := c.actor("f1").GetStatus(); st.GetFrozenTime() != nil {
		t.Errorf("CRASHED f1 still shown frozen since %v", st.GetFrozenTime())
	}
	c.suspend(holder)
	count = suspended
	request("resumed on another node after its node was lost")
	if n := c.actor("f1").GetStatus().GetWorker().GetNode(); n != local.name {
		t.Fatalf("f1 resumed on %q, want %s", n, local.name)
	}
	remote.restart(c)
	c.waitFor("the lost node's frozen workload dropped", func() bool { return len(stillRunning(t, remote.stateDir, gone)) == 0 })

	// A delete of the frozen actor (on a node agent in the test process,
	// its gate inside it) leaves nothing of it.
	waitFrozen("before its delete")
	gone = sandboxProcesses(t, c, local.state, "f1")
	if _, err := c.actors.DeleteActor(c.ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: "default", Name: "f1", Force: true})); err != nil {
		t.Fatalf("delete the frozen f1: %v", err)
	}
	c.waitFor("f1 gone", func() bool {
		_, err := c.actors.GetActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "f1"}))
		return connect.CodeOf(err) == connect.CodeNotFound
	})
	if left := stillRunning(t, local.state, gone); len(left) > 0 {
		t.Errorf("left on %s after the frozen actor's delete:\n%s", local.name, strings.Join(left, "\n"))
	}

	// The node process stopped with a frozen actor on it (its sandbox
	// and the gate stay, by design), then cleaned up: nothing is left.
	c.mustResume(holder)
	c.createActor("f2", "freezer")
	if n := c.mustResume("f2").GetStatus().GetWorker().GetNode(); n != remote.name {
		t.Fatalf("f2 runs on %q, want %s", n, remote.name)
	}
	c.waitFor("f2 frozen", func() bool { return c.actor("f2").GetStatus().GetFrozenTime() != nil })
	stopNodeProcess(t, remote.process)
	out, err := exec.Command(torporBinary(t), "node", "--cleanup", "--name", remote.name, "--state-dir", remote.stateDir,
		"--bridge", remote.network.Bridge, "--cidr", remote.network.CIDR, "--runsc", runtimetest.Runsc(t)).CombinedOutput()
	if err != nil {
		t.Fatalf("torpor node --cleanup with a frozen sandbox: %v\n%s", err, out)
	}
	if left := nodeLeftovers(t, remote); len(left) > 0 {
		t.Errorf("left after torpor node --cleanup of a node with a frozen actor:\n%s", strings.Join(left, "\n"))
	}
}

// sandboxProcesses lists the runsc processes of actor's worker under a
// node's state directory, failing the test if there are none.
func sandboxProcesses(t *testing.T, c *cluster, stateDir, actor string) []string {
	t.Helper()
	worker := c.actor(actor).GetStatus().GetWorker().GetName()
	var out []string
	for _, p := range runscProcesses(t, stateDir) {
		if strings.Contains(p, worker) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no process of %s's worker %s among runsc's: a check of what is left cannot fail", actor, worker)
	}
	return out
}

// stillRunning returns those of procs (pid and command lines) that still
// run: a warm sandbox made since on the same worker is other processes.
func stillRunning(t *testing.T, stateDir string, procs []string) []string {
	t.Helper()
	now := map[string]bool{}
	for _, p := range runscProcesses(t, stateDir) {
		now[p] = true
	}
	var left []string
	for _, p := range procs {
		if now[p] {
			left = append(left, p)
		}
	}
	return left
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// execOut runs cmd in container of actor through the API and returns its
// standard output, failing the test unless it exits 0.
func (c *cluster) execOut(t *testing.T, actor, container string, cmd ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	defer cancel()
	stream := c.actors.ExecActor(ctx)
	if err := stream.Send(&torporv1.ExecActorRequest{Space: "default", Name: actor, Process: &torporv1.ExecProcess{Container: container, Command: cmd}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for {
		msg, err := stream.Receive()
		if err != nil {
			t.Fatalf("exec %v in %s: %v", cmd, actor, err)
		}
		out.Write(msg.GetStdout())
		if e := msg.GetExit(); e != nil {
			if e.GetCode() != 0 {
				t.Fatalf("exec %v in %s: exit %d", cmd, actor, e.GetCode())
			}
			return out.String()
		}
	}
}

// TestFrozenActorsRelieveMemory: on a node short of memory (here a floor
// of 100%: always), the control plane takes frozen actors down the idle
// ladder (PAUSED, as their idle action says), and leaves those that are
// not frozen running; the paused actor comes back with its memory.
func TestFrozenActorsRelieveMemory(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2, nodeMemoryFloor: 100})
	c.applyTemplate(counterTemplate(t, "freezer", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{FreezeSeconds: 1, Action: torporv1.IdleAction_IDLE_ACTION_PAUSE}
	}))
	c.applyTemplate(counterTemplate(t, "plain", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{}
	}))
	c.createActor("f1", "freezer")
	c.createActor("p1", "plain")
	c.mustResume("p1")
	if code, _, body := c.routerGet("f1"); code != http.StatusOK || body != "count=1 lines=1" {
		t.Fatalf("first request: %d %q", code, body)
	}
	c.waitFor("f1 PAUSED for its node's memory", func() bool {
		return c.actor("f1").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_PAUSED
	})
	ev := c.lastEventTo("f1", torporv1.ActorState_ACTOR_STATE_PAUSING)
	if !strings.Contains(ev.GetReason(), "short of memory") || !strings.Contains(ev.GetReason(), "below its floor of 100%") {
		t.Errorf("f1's pause says %q, want the node's memory named", ev.GetReason())
	}
	var frozeFirst bool
	for _, ev := range c.events("f1") {
		if strings.HasPrefix(ev.GetReason(), "frozen: ") {
			frozeFirst = true
		}
		if ev.GetToState() == torporv1.ActorState_ACTOR_STATE_PAUSING {
			break
		}
	}
	if !frozeFirst {
		t.Errorf("f1 was paused without being frozen first: %v", c.events("f1"))
	}
	time.Sleep(2 * time.Second)
	if st := c.actor("p1").GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("p1, never frozen, is %s under memory pressure; want RUNNING", st)
	}
	if code, _, body := c.routerGet("f1"); code != http.StatusOK || body != "count=2 lines=2" {
		t.Fatalf("request after the pause: %d %q, want count=2 lines=2", code, body)
	}
}
