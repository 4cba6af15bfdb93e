package e2e

import (
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// TestNodeStopLeavesNothing stops `torpor node` with SIGTERM: with no
// actor running on it (its workers warm for the actors suspended out of
// them), nothing of the node may remain: no process, mount, network
// namespace, veth, bridge or nftables table. With an actor running, the
// stop keeps its sandbox and network for the next start, and `torpor
// node --cleanup` removes them, saying so.
func TestNodeStopLeavesNothing(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	local := c.nodes[0]
	remote := c.startNodeProcess(2)
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.holdWorkerOf(local.name, "counter")
	c.createActor("c1", "counter")
	a := c.mustResume("c1")
	if n := a.GetStatus().GetWorker().GetNode(); n != remote.name {
		t.Fatalf("c1 runs on node %q, want the agent process's node %s", n, remote.name)
	}
	if got := get(t, a); got != "count=1 lines=1" {
		t.Fatalf("c1: %q, want count=1 lines=1", got)
	}
	c.suspend("c1")
	c.waitFor("the worker c1 left to be warm", func() bool { return len(runscProcesses(t, remote.stateDir)) > 0 })
	if left := nodeLeftovers(t, remote); len(left) == 0 {
		t.Fatal("the running node shows nothing this test would see left behind")
	}

	stopNodeProcess(t, remote.process)
	if left := nodeLeftovers(t, remote); len(left) > 0 {
		t.Errorf("left after SIGTERM of a node running no actor:\n%s", strings.Join(left, "\n"))
	}

	// An actor running: the stop keeps it for the next start; --cleanup
	// then removes all of it.
	remote.process = startProcess(t, "node-"+remote.name+"-again", remote.args...)
	c.waitForWorkers(remote.name, remote.workers)
	a = c.mustResume("c1")
	if n := a.GetStatus().GetWorker().GetNode(); n != remote.name {
		t.Fatalf("c1 resumed on node %q, want %s", n, remote.name)
	}
	if got := get(t, a); got != "count=2 lines=2" {
		t.Fatalf("c1 after the restarted node resumed it: %q, want count=2 lines=2", got)
	}
	stopNodeProcess(t, remote.process)
	if len(runscProcesses(t, remote.stateDir)) == 0 {
		t.Fatal("SIGTERM removed the sandbox of a running actor")
	}
	out, err := exec.Command(torporBinary(t), "node", "--cleanup", "--name", remote.name, "--state-dir", remote.stateDir,
		"--bridge", remote.network.Bridge, "--cidr", remote.network.CIDR, "--runsc", runtimetest.Runsc(t)).CombinedOutput()
	if err != nil {
		t.Fatalf("torpor node --cleanup: %v\n%s", err, out)
	}
	for _, want := range []string{"removed sandbox of worker " + remote.name + "-w", "removed bridge " + remote.network.Bridge, "removed network namespace", "removed veth", "removed nftables table"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("torpor node --cleanup said:\n%s\nwant %q", out, want)
		}
	}
	if left := nodeLeftovers(t, remote); len(left) > 0 {
		t.Errorf("left after torpor node --cleanup:\n%s", strings.Join(left, "\n"))
	}
}

// TestUpStopLeavesNothing stops `torpor up` with SIGTERM after it ran an
// actor (and was killed and started again under it): it suspends the
// actor, and nothing of its node may remain, so the data directory can be
// removed.
func TestUpStopLeavesNothing(t *testing.T) {
	runtimetest.RequireRoot(t)
	dataDir := shortTempDir(t)
	routerAddr := testkit.FreeAddr(t)
	suffix := randomHex(3)
	n := &nodeProcess{
		name: "e2s-" + suffix, stateDir: filepath.Join(dataDir, "node"), workers: 2,
		network: netns.Config{Bridge: "ts" + suffix, CIDR: fmt.Sprintf("10.%d.%d.0/24", 240+mrand.IntN(4), mrand.IntN(256))},
	}
	n.network.Node = n.name
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	args := []string{"up", "--data-dir", dataDir, "--listen", testkit.FreeAddr(t), "--router-listen", routerAddr, "--node-listen", testkit.FreeAddr(t),
		"--node-name", n.name, "--workers", strconv.Itoa(n.workers), "--bridge", n.network.Bridge, "--cidr", n.network.CIDR, "--runsc", runtimetest.Runsc(t)}
	n.process = startProcess(t, "up", append(args, allowExamples(t)...)...)
	t.Cleanup(func() { n.removeLeftovers(t) })
	waitForOutput(t, n.process, "Torpor is up.")
	cli := func(args ...string) {
		t.Helper()
		cmd := exec.Command(torporBinary(t), args...)
		cmd.Dir = moduleRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("torpor %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	cli("template", "apply", "-f", "examples/counter/template.yaml", "--wait")
	cli("actor", "create", "c1", "--template", "counter")
	curl := func(want string) {
		t.Helper()
		out, err := exec.Command("curl", "-sS", "--max-time", "30", "-H", "Host: c1.default.actors.localhost", "http://"+routerAddr+"/").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Fatalf("curl: %q, %v; want %s", out, err, want)
		}
	}
	curl("count=1 lines=1")

	// Killed, up leaves its node behind; started again, it takes it over
	// (the running actor with its memory) before it stops clean.
	n.process.kill()
	n.process = startProcess(t, "up-again", n.process.cmd.Args[1:]...)
	waitForOutput(t, n.process, "Torpor is up.")
	curl("count=2 lines=2")

	stopNodeProcess(t, n.process)
	if out := tail(n.process.logPath, 4096); !strings.Contains(out, "Suspended 1 actor(s).") {
		t.Errorf("torpor up's shutdown:\n%s\nwant one actor suspended", out)
	}
	if left := nodeLeftovers(t, n); len(left) > 0 {
		t.Errorf("left after SIGTERM of torpor up:\n%s", strings.Join(left, "\n"))
	}
	if err := os.RemoveAll(dataDir); err != nil {
		t.Errorf("rm -rf of the data directory after torpor up stopped: %v", err)
	}
}

// stopNodeProcess sends SIGTERM and waits for a clean exit.
func stopNodeProcess(t *testing.T, p *process) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s did not stop within 2 minutes of SIGTERM", p.name)
	}
	if !p.cmd.ProcessState.Success() {
		t.Fatalf("%s exited with %v:\n%s", p.name, p.cmd.ProcessState, tail(p.logPath, 4096))
	}
}

// runscProcesses lists the processes of the runsc under a node's state
// directory: sandboxes, warm or running, and their gofers.
func runscProcesses(t testing.TB, stateDir string) []string {
	return processesMentioning(t, filepath.Join(stateDir, "gvisor"))
}

// nodeLeftovers lists what of node n is on the host: processes and mounts
// under its state directory, its network namespaces, veths, bridge and
// nftables table.
func nodeLeftovers(t testing.TB, n *nodeProcess) []string {
	t.Helper()
	left := processesMentioning(t, n.stateDir)
	for _, m := range runtimetest.MountsUnder(t, n.stateDir) {
		left = append(left, "mount "+m)
	}
	prefix := "torpor-" + n.name + "-"
	entries, err := os.ReadDir(netns.Dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			left = append(left, "network namespace "+e.Name())
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		// A slot's host veth carries its namespace's name as alias.
		if l.Attrs().Name == n.network.Bridge || strings.HasPrefix(l.Attrs().Alias, prefix) {
			left = append(left, l.Type()+" "+l.Attrs().Name)
		}
	}
	nft, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := nft.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == "torpor-"+n.network.Bridge {
			left = append(left, "nftables table "+tb.Name)
		}
	}
	return left
}
