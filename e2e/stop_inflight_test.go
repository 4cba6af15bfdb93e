package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// slowStarter is a template whose golden build waits about 4 s for its
// readiness, so a stop can land in the middle of it; its image has a
// shell and sleep, for execs.
func slowStarter(name, pinned string) *torporv1.Template {
	return &torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: name}, Spec: &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers: []*torporv1.Container{{
			Name: "app", Image: pinned, Command: []string{"/bin/sh", "-c", "sleep 4; echo ready > /tmp/ready; exec sleep 1000000"},
			ReadinessProbe: &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/bin/cat", "/tmp/ready"}}, TimeoutSeconds: 60, PeriodSeconds: 1},
		}},
	}}
}

// upUnderPipe is `torpor up` with its standard output and error on a
// pipe whose reader goes away once up says it is up, as `torpor up | tee
// up.log` when Ctrl-C ends tee first. What it printed until then is in
// its log file.
func upUnderPipe(t *testing.T, name string, args ...string) *process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(torporBinary(t), args...)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatalf("start torpor %s: %v", strings.Join(args, " "), err)
	}
	w.Close() // the child has its own descriptor
	go func() {
		defer logFile.Close()
		defer r.Close() // the reader dies first
		lines := bufio.NewScanner(r)
		for lines.Scan() {
			fmt.Fprintln(logFile, lines.Text())
			if strings.Contains(lines.Text(), "Ctrl-C suspends running actors and stops.") {
				return
			}
		}
	}()
	p := &process{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		cmd.Wait() //nolint:errcheck // judged by the test from ProcessState
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("output of %s until its reader left:\n%s", name, tail(logPath, 8<<10))
		}
	})
	waitForOutput(t, p, "Ctrl-C suspends running actors and stops.")
	return p
}

// TestUpStopMidOperationLeavesNothing stops `torpor up` (Ctrl-C, its
// output's reader gone first) in the middle of each kind of work: a golden
// build, a resume, a suspend, an exec and a TCP tunnel. Each stop ends
// with exit status 0 and leaves nothing: no runsc process, mount, network
// namespace, veth, bridge or nftables table. The tunnel goes through the
// router --router-listen moved, which port-forward finds in the client
// config up wrote.
func TestUpStopMidOperationLeavesNothing(t *testing.T) {
	runtimetest.RequireRoot(t)
	dataDir := shortTempDir(t)
	routerAddr := testkit.FreeAddr(t)
	suffix := randomHex(3)
	n := &nodeProcess{
		name: "e2m-" + suffix, stateDir: filepath.Join(dataDir, "node"), workers: 2,
		network: netns.Config{Bridge: "tm" + suffix, CIDR: fmt.Sprintf("10.%d.%d.0/24", 240+mrand.IntN(4), mrand.IntN(256))},
	}
	n.network.Node = n.name
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	for _, k := range []string{client.EnvServer, client.EnvCA, client.EnvToken, client.EnvRouter} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	pinned := buildShellImage(t, filepath.Join(dataDir, "images"))
	args := append([]string{"up", "--data-dir", dataDir, "--listen", testkit.FreeAddr(t), "--router-listen", routerAddr, "--node-listen", testkit.FreeAddr(t),
		"--node-name", n.name, "--workers", strconv.Itoa(n.workers), "--bridge", n.network.Bridge, "--cidr", n.network.CIDR, "--runsc", runtimetest.Runsc(t)},
		allowExamples(t)...)
	t.Cleanup(func() { n.removeLeftovers(t) })
	ctx := t.Context()
	var api *client.Client
	start := func(t *testing.T, name string) {
		t.Helper()
		n.process = upUnderPipe(t, name, args...)
		conn, err := client.Discover(client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if api, err = client.New(conn); err != nil {
			t.Fatal(err)
		}
	}
	stop := func(t *testing.T, during string) {
		t.Helper()
		n.process.signal(t, syscall.SIGINT)
		select {
		case <-n.process.exited:
		case <-time.After(3 * time.Minute):
			t.Fatalf("torpor up did not stop within 3 minutes of Ctrl-C during %s", during)
		}
		if st := n.process.cmd.ProcessState; !st.Success() {
			t.Errorf("torpor up stopped during %s under a closed pipe: %v, want exit status 0", during, st)
		}
		if left := nodeLeftovers(t, n); len(left) > 0 {
			t.Errorf("left after Ctrl-C of torpor up during %s:\n%s", during, strings.Join(left, "\n"))
		}
	}
	actorState := func(name string) torporv1.ActorState {
		resp, err := api.Actors.GetActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: name}))
		if err != nil {
			return torporv1.ActorState_ACTOR_STATE_UNSPECIFIED
		}
		return resp.Msg.GetStatus().GetState()
	}
	waitUntil := func(t *testing.T, what string, limit time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s", what, limit)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	templatePhase := func(name string) torporv1.TemplatePhase {
		resp, err := api.Templates.GetTemplate(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: name}))
		if err != nil {
			return torporv1.TemplatePhase_TEMPLATE_PHASE_UNSPECIFIED
		}
		return resp.Msg.GetStatus().GetPhase()
	}
	// inBackground runs call and, at the test's end, waits for it (its
	// error is the stop's to cause).
	var calls sync.WaitGroup
	t.Cleanup(calls.Wait)
	inBackground := func(call func()) {
		calls.Add(1)
		go func() { defer calls.Done(); call() }()
	}

	t.Run("golden build", func(t *testing.T) {
		start(t, "up-build")
		if _, err := api.Templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: slowStarter("slow", pinned)})); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the golden build's sandbox", 2*time.Minute, func() bool {
			return templatePhase("slow") == torporv1.TemplatePhase_TEMPLATE_PHASE_BUILDING && len(runscProcesses(t, n.stateDir)) > 0
		})
		stop(t, "a golden build")
	})

	t.Run("resume", func(t *testing.T) {
		start(t, "up-resume")
		waitUntil(t, "template slow READY", 2*time.Minute, func() bool { return templatePhase("slow") == torporv1.TemplatePhase_TEMPLATE_PHASE_READY })
		if _, err := api.Actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
			Metadata: &torporv1.ObjectMeta{Space: "default", Name: "a1"}, Spec: &torporv1.ActorSpec{Template: "slow"}}})); err != nil {
			t.Fatal(err)
		}
		inBackground(func() {
			api.Actors.ResumeActor(context.Background(), connect.NewRequest(&torporv1.ResumeActorRequest{Space: "default", Name: "a1"})) //nolint:errcheck // the stop may cut it
		})
		waitUntil(t, "a1 RESUMING", time.Minute, func() bool { return actorState("a1") == torporv1.ActorState_ACTOR_STATE_RESUMING })
		stop(t, "a resume")
	})

	resumeA1 := func(t *testing.T) {
		t.Helper()
		if _, err := api.Actors.ResumeActor(ctx, connect.NewRequest(&torporv1.ResumeActorRequest{Space: "default", Name: "a1"})); err != nil {
			t.Fatalf("resume a1: %v", err)
		}
	}
	t.Run("suspend", func(t *testing.T) {
		start(t, "up-suspend")
		resumeA1(t)
		inBackground(func() {
			api.Actors.SuspendActor(context.Background(), connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "a1"})) //nolint:errcheck // the stop may cut it
		})
		waitUntil(t, "a1 SUSPENDING", time.Minute, func() bool { return actorState("a1") == torporv1.ActorState_ACTOR_STATE_SUSPENDING })
		stop(t, "a suspend")
	})

	t.Run("exec", func(t *testing.T) {
		start(t, "up-exec")
		resumeA1(t)
		execCmd := exec.Command(torporBinary(t), "actor", "exec", "a1", "--", "sleep", "1000")
		if err := execCmd.Start(); err != nil {
			t.Fatal(err)
		}
		inBackground(func() { execCmd.Wait() }) //nolint:errcheck // the stop ends it
		waitUntil(t, "the exec's runsc", time.Minute, func() bool { return len(execProcesses(t, n.stateDir)) > 0 })
		stop(t, "an exec")
	})

	t.Run("tunnel", func(t *testing.T) {
		start(t, "up-tunnel")
		cmd := exec.Command(torporBinary(t), "template", "apply", "-f", "examples/counter/template.yaml", "--wait")
		cmd.Dir = moduleRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("template apply: %v\n%s", err, out)
		}
		if out, err := exec.Command(torporBinary(t), "actor", "create", "c1", "--template", "counter").CombinedOutput(); err != nil {
			t.Fatalf("actor create: %v\n%s", err, out)
		}
		local := testkit.FreeAddr(t)
		_, port, _ := net.SplitHostPort(local)
		forward := exec.Command(torporBinary(t), "actor", "port-forward", "c1", port+":8080")
		out, err := forward.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		forward.Stderr = &stderr
		if err := forward.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { forward.Process.Kill(); forward.Wait() }) //nolint:errcheck // killed by design
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "Forwarding from") {
			t.Fatalf("port-forward after up --router-listen %s: %q, %v\n%s", routerAddr, line, err, stderr.String())
		}
		conn, err := net.Dial("tcp", local)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: c1\r\n\r\n")
		status, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || !strings.Contains(status, "200") {
			t.Fatalf("GET / through the tunnel: %q, %v", status, err)
		}
		go io.Copy(io.Discard, conn) //nolint:errcheck // held open across the stop
		stop(t, "an open tunnel")
	})
}

// TestNodeStopMidOperationLeavesNothing stops `torpor node` (SIGTERM) in
// the middle of a golden build, an exec and a suspend. The agent runs
// with TORPOR_CA exported, as the README has the CLI's users do, beside
// its --ca-fingerprint: the flag it was given wins. Each stop ends with
// exit status 0; the build's sandbox goes with it, the exec's process
// too; with no actor left running on the node, nothing of it remains.
func TestNodeStopMidOperationLeavesNothing(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, c.conn.CA, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TORPOR_CA", caFile)
	// The holder is never evicted: an actor resumed once a golden build
	// left the node process's worker must wait for that worker.
	c.applyTemplate(counterTemplate(t, "counter", func(s *torporv1.TemplateSpec) {
		s.IdlePolicy = &torporv1.IdlePolicy{Eviction: &torporv1.EvictionPolicy{Never: true}}
	}))
	c.holdWorkerOf(c.nodes[0].name, "counter")
	remote := c.startNodeProcess(1)
	token := c.apiToken("default")
	again := func(t *testing.T, name string) {
		t.Helper()
		since := time.Now()
		remote.process = startProcess(t, "node-"+name, remote.args...)
		remote.waitForHeartbeat(c, since)
	}
	stopped := func(t *testing.T, during string, leavesNothing bool) {
		t.Helper()
		stopNodeProcess(t, remote.process)
		if left := execProcesses(t, remote.stateDir); len(left) > 0 {
			t.Errorf("runsc exec processes left after SIGTERM during %s:\n%s", during, strings.Join(left, "\n"))
		}
		if !leavesNothing {
			return
		}
		if left := nodeLeftovers(t, remote); len(left) > 0 {
			t.Errorf("left after SIGTERM of torpor node during %s:\n%s", during, strings.Join(left, "\n"))
		}
	}

	// The shell image is outside the examples the agent reads from.
	images := t.TempDir()
	pinned := buildShellImage(t, images)
	remote.args = append(remote.args, "--allow-image-dir", images)
	remote.kill()
	again(t, "with-images")

	t.Run("golden build", func(t *testing.T) {
		if _, err := c.templates.CreateTemplate(c.ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: slowStarter("slow", pinned)})); err != nil {
			t.Fatal(err)
		}
		c.waitFor("the golden build's sandbox on the node process", func() bool { return len(runscProcesses(t, remote.stateDir)) > 0 })
		stopped(t, "a golden build", true)
	})

	t.Run("exec", func(t *testing.T) {
		again(t, "exec")
		c.waitFor("template slow READY", func() bool {
			resp, err := c.templates.GetTemplate(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "slow"}))
			return err == nil && resp.Msg.GetStatus().GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_READY
		})
		c.createActor("a1", "slow")
		// READY comes before the build's worker is given back.
		c.waitFor("the node process's worker free", func() bool {
			for _, w := range c.listWorkers() {
				if w.GetSpec().GetNode() == remote.name && w.GetStatus().GetActor().GetUid() == "" {
					return true
				}
			}
			return false
		})
		if n := c.mustResume("a1").GetStatus().GetWorker().GetNode(); n != remote.name {
			t.Fatalf("a1 runs on %s, want the node process %s", n, remote.name)
		}
		sleeper := c.torporAs(token, "actor", "exec", "a1", "--", "sleep", "1000")
		if err := sleeper.Start(); err != nil {
			t.Fatal(err)
		}
		defer sleeper.Wait() //nolint:errcheck // the stop ends it
		c.waitFor("the exec's runsc", func() bool { return len(execProcesses(t, remote.stateDir)) > 0 })
		// The running actor's sandbox stays for the next start, by design.
		stopped(t, "an exec", false)
	})

	t.Run("suspend", func(t *testing.T) {
		again(t, "suspend")
		if st := c.actor("a1").GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_RUNNING {
			t.Fatalf("a1 after the node came back: %s, want RUNNING (adopted)", st)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.actors.SuspendActor(context.Background(), connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "a1"})) //nolint:errcheck // the stop may cut it
		}()
		defer func() { <-done }()
		c.waitFor("a1 SUSPENDING", func() bool {
			return c.actor("a1").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_SUSPENDING
		})
		stopped(t, "a suspend", true)
	})
}

// execProcesses lists the runsc exec processes of a node's sandboxes.
func execProcesses(t testing.TB, stateDir string) []string {
	var out []string
	for _, p := range runscProcesses(t, stateDir) {
		if strings.Contains(p, " exec ") {
			out = append(out, p)
		}
	}
	return out
}
