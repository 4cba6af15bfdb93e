package node

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/vishvananda/netlink"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/runtime/gvisor"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

// helperEnv makes the test binary run a node agent instead of the tests,
// configured by the JSON of helperConfig in the variable.
const helperEnv = "TORPOR_NODE_TEST_AGENT"

type helperConfig struct {
	Name, ServerURL, StateDir, Snapshots, Runsc string
	// CAFingerprint and JoinToken join the node on its first start.
	CAFingerprint, JoinToken string
	Network                  netns.Config
	// ImageDirs are where the agent may read local images from.
	ImageDirs []string
	// KillAt names the testHook point where the agent kills itself with
	// SIGKILL.
	KillAt string
}

func (c helperConfig) gvisor() (*gvisor.Runtime, error) {
	return gvisor.New(gvisor.Config{ConfigureNetwork: netns.Configure, Runsc: c.Runsc, RootDir: filepath.Join(c.StateDir, "gvisor")})
}

// helperAgent runs the agent of the configuration in helperEnv until
// SIGTERM and returns the exit code.
func helperAgent() int {
	var cfg helperConfig
	if err := json.Unmarshal([]byte(os.Getenv(helperEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if cfg.KillAt != "" {
		testHook = func(point string) {
			if point == cfg.KillAt {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := func() error {
		rt, err := cfg.gvisor()
		if err != nil {
			return err
		}
		network, err := netns.New(cfg.Network)
		if err != nil {
			return err
		}
		objects, err := snapshot.NewDirStore(cfg.Snapshots)
		if err != nil {
			return err
		}
		images, err := image.NewPolicy(image.PolicyConfig{Dirs: cfg.ImageDirs})
		if err != nil {
			return err
		}
		a, err := New(Config{
			Name: cfg.Name, ServerURL: cfg.ServerURL, Listen: "127.0.0.1:0", Workers: 2, StateDir: cfg.StateDir,
			CAFingerprint: cfg.CAFingerprint, JoinToken: func(context.Context) (string, error) { return cfg.JoinToken, nil },
			Runtime: rt, Snapshots: objects, Network: network, HeartbeatInterval: 100 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)), Images: images,
		})
		if err != nil {
			return err
		}
		return a.Run(ctx)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// agentProcess is a node agent in a child process.
type agentProcess struct {
	cmd     *exec.Cmd
	client  torporv1connect.NodeAgentServiceClient
	address string
}

// spawn starts the agent and waits until it registered from a new address.
func spawn(t *testing.T, cfg helperConfig, reg *registry, previous string) *agentProcess {
	t.Helper()
	env, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+string(env))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if !testing.Verbose() {
		cmd.Stdout, cmd.Stderr = nil, nil
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &agentProcess{cmd: cmd}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	waitFor(t, "the agent process to register", func() bool {
		r := reg.registration(cfg.Name)
		if r == nil || r.GetNode().GetAddress() == previous {
			return false
		}
		p.address = r.GetNode().GetAddress()
		return true
	})
	p.client = torporv1connect.NewNodeAgentServiceClient(reg.client(cfg.Name), p.address)
	return p
}

// TestKilledAgentAdoptsItsWorkloads kills the agent process with SIGKILL
// (while idle, then in the middle of an operation) and checks that its
// successor adopts the running workload without running it twice, finishes
// or undoes the interrupted operation, and that a terminate then leaves
// nothing behind.
func TestKilledAgentAdoptsItsWorkloads(t *testing.T) {
	cfg, reg, rt := newKilledNode(t, "k")
	name := cfg.Name
	ctx := context.Background()
	tmpl := counterTemplate(runtimetest.CounterImage(t))
	w0, w1 := WorkerName(name, 0), WorkerName(name, 1)
	runReq := &torporv1.RunRequest{Op: op("actor-k", "op-run", w0), Workload: workload("actor-k", "k", tmpl)}

	p := spawn(t, cfg, reg, "")
	first, err := p.client.Run(ctx, connect.NewRequest(runReq))
	if err != nil {
		t.Fatal(err)
	}
	ip := first.Msg.GetWorkerIp()
	get(t, ip)
	get(t, ip)

	kill := func(p *agentProcess) {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		p.cmd.Wait()
	}
	kill(p)
	if got := get(t, ip); got != "count=3 lines=3" {
		t.Fatalf("workload after the agent died: %q, want count=3 lines=3", got)
	}

	p = spawn(t, cfg, reg, p.address)
	st, err := p.client.Stats(ctx, connect.NewRequest(&torporv1.StatsRequest{Worker: w0}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Msg.GetRunning() || st.Msg.GetActorUid() != "actor-k" {
		t.Fatalf("after restart: stats %v, want actor-k running", st.Msg)
	}
	// The retried Run is answered from the record, not run again.
	again, err := p.client.Run(ctx, connect.NewRequest(runReq))
	if err != nil || again.Msg.GetWorkerIp() != ip {
		t.Fatalf("retried Run: %v, %v", again, err)
	}
	if got := get(t, ip); got != "count=4 lines=4" {
		t.Fatalf("adopted workload: %q, want count=4 lines=4 (not restarted)", got)
	}
	wantSandboxes(t, rt, w0)

	// Killed while runsc starts a sandbox for a Run on the other worker:
	// the successor undoes what the Run began; its retry then runs it
	// once.
	other := &torporv1.RunRequest{Op: op("actor-j", "op-run-j", w1), Workload: workload("actor-j", "j", tmpl)}
	go p.client.Run(context.Background(), connect.NewRequest(other))
	waitFor(t, "runsc to start a sandbox", func() bool { return len(runscCommands(t, cfg.StateDir, "run")) > 0 })
	kill(p)
	p = spawn(t, cfg, reg, p.address)
	second, err := p.client.Run(ctx, connect.NewRequest(other))
	if err != nil {
		t.Fatalf("Run retried after the agent died during it: %v", err)
	}
	if got := get(t, second.Msg.GetWorkerIp()); got != "count=1 lines=1" {
		t.Fatalf("actor-j: %q, want count=1 lines=1", got)
	}
	wantSandboxes(t, rt, w0, w1)

	for i, actor := range []string{"actor-k", "actor-j"} {
		if _, err := p.client.Terminate(ctx, connect.NewRequest(&torporv1.TerminateRequest{Op: op(actor, "op-term", WorkerName(name, i))})); err != nil {
			t.Fatal(err)
		}
	}
	wantSandboxes(t, rt)
	agent := &gvisorNode{stateDir: cfg.StateDir, runtime: rt}
	agent.wantNoWorkloads(t)

	// Stopped with no workload left, the agent leaves nothing at all: no
	// mount (runsc's shared namespace included), no network.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("agent exited with %v", err)
	}
	if m := runtimetest.MountsUnder(t, cfg.StateDir); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	entries, _ := os.ReadDir(netns.Dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "torpor-"+name+"-") {
			t.Errorf("network namespace left: %s", e.Name())
		}
	}
	if _, err := netlink.LinkByName(cfg.Network.Bridge); err == nil {
		t.Errorf("bridge %s left", cfg.Network.Bridge)
	}
}

// runscCommands lists the runsc processes running command (run, restore,
// ...) for the runtime under stateDir.
func runscCommands(t testing.TB, stateDir, command string) []string {
	t.Helper()
	root := "--root=" + filepath.Join(stateDir, "gvisor", "runsc")
	var out []string
	for _, p := range processesMentioning(t, root) {
		fields := strings.Fields(p)
		if len(fields) > 1 && strings.HasSuffix(fields[1], "runsc") && slices.Contains(fields, command) {
			out = append(out, p)
		}
	}
	return out
}

func wantSandboxes(t *testing.T, rt *gvisor.Runtime, want ...string) {
	t.Helper()
	got, err := rt.Sandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("sandboxes %v, want %v", got, want)
	}
}
