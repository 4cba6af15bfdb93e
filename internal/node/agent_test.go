package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/fake"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/validate"
)

// loopback is a Network for unit tests: no namespaces, slot i at
// 127.<net>.<i+2>, where test servers standing in for workloads can bind.
type loopback struct{ net int }

func (l loopback) Slot(_ context.Context, name string, index int) (runtime.Slot, error) {
	return runtime.Slot{Name: name, IP: fmt.Sprintf("127.%d.%d.%d", l.net, index/250, index%250+2)}, nil
}

var loopbackNets atomic.Int32

var (
	tinyOnce   sync.Once
	tinyPinned string
	tinyErr    error
)

// tinyImage is a pinned one-file image, built once per test binary.
func tinyImage(t testing.TB) string {
	t.Helper()
	tinyOnce.Do(func() {
		dir, err := os.MkdirTemp("", "node-test-image-")
		if err != nil {
			tinyErr = err
			return
		}
		testDirs = append(testDirs, dir)
		app := filepath.Join(dir, "app")
		if err := os.WriteFile(app, []byte("#!/bin/true\n"), 0o755); err != nil {
			tinyErr = err
			return
		}
		layout := filepath.Join(dir, "layout")
		if _, err := image.BuildLayout(context.Background(), layout, image.LayoutSpec{Files: map[string]string{"/app": app}, Tag: "v1"}); err != nil {
			tinyErr = err
			return
		}
		tinyPinned, tinyErr = image.Resolve(context.Background(), image.LayoutScheme+layout+":v1", "")
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return tinyPinned
}

// testDirs are removed when the test binary ends.
var testDirs []string

func appTemplate(t testing.TB) *torporv1.TemplateSpec {
	return &torporv1.TemplateSpec{
		Containers: []*torporv1.Container{{
			Name: "app", Image: tinyImage(t), Command: []string{"/app"},
			Mounts: []*torporv1.Mount{{Volume: "data", Path: "/data"}},
		}},
		Volumes: []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
	}
}

// fakeNode is an agent on the fake runtime over real HTTP.
type fakeNode struct {
	*running
	name     string
	cfg      Config
	rt       *fake.Runtime
	net      loopback
	registry *registry
	tmpl     *torporv1.TemplateSpec
}

func newFakeNode(t *testing.T, options ...func(*Config)) *fakeNode {
	t.Helper()
	reg := newRegistry(t)
	objects, err := snapshot.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{
		name: "n1", rt: fake.New(), net: loopback{int(loopbackNets.Add(1))%200 + 20}, registry: reg, tmpl: appTemplate(t),
	}
	n.cfg = Config{
		Name: n.name, Workers: 2, Pool: "p", Labels: map[string]string{"zone": "a"},
		StateDir: t.TempDir(), Runtime: n.rt, Snapshots: objects, Network: n.net, HeartbeatInterval: 20 * time.Millisecond,
		Images: runtimetest.ImagePolicy(t),
	}
	reg.join(t, &n.cfg)
	for _, o := range options {
		o(&n.cfg)
	}
	n.start(t)
	return n
}

// start runs a (new) agent over the node's state directory and runtime.
func (n *fakeNode) start(t *testing.T) {
	t.Helper()
	cfg := n.cfg
	cfg.Listener = nil
	n.running = startAgent(t, n.registry, cfg)
}

// restart stops the agent and starts another on the same state and
// sandboxes, as after a crash of the agent process.
func (n *fakeNode) restart(t *testing.T) {
	t.Helper()
	if err := n.stop(); err != nil {
		t.Fatalf("agent stopped with %v", err)
	}
	n.start(t)
}

func (n *fakeNode) worker(i int) string { return WorkerName(n.name, i) }

func (n *fakeNode) workload(actorUID string) *torporv1.Workload {
	return &torporv1.Workload{Space: "s", Actor: "actor-" + actorUID, ActorUid: actorUID, TemplateName: "app", TemplateUid: "t1", Template: n.tmpl}
}

func (n *fakeNode) run(ctx context.Context, actorUID, opID string, worker int) (*connect.Response[torporv1.RunResponse], error) {
	return n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op(actorUID, opID, n.worker(worker)), Workload: n.workload(actorUID)}))
}

func (n *fakeNode) terminate(ctx context.Context, actorUID, opID string, worker int) error {
	_, err := n.client.Terminate(ctx, connect.NewRequest(&torporv1.TerminateRequest{Op: op(actorUID, opID, n.worker(worker))}))
	return err
}

func (n *fakeNode) stats(t *testing.T, worker int) *torporv1.StatsResponse {
	t.Helper()
	resp, err := n.client.Stats(context.Background(), connect.NewRequest(&torporv1.StatsRequest{Worker: n.worker(worker)}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg
}

// calls counts the runtime calls of method on worker.
func (n *fakeNode) calls(method string, worker int) int {
	c := 0
	for _, call := range n.rt.Calls() {
		if call.Method == method && call.Slot == n.worker(worker) {
			c++
		}
	}
	return c
}

func (n *fakeNode) volumeDir(actorUID string) string {
	return filepath.Join(n.cfg.StateDir, "volumes", actorUID)
}

func (n *fakeNode) touchLines(t *testing.T, actorUID string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.volumeDir(actorUID), "data", fake.TouchLog))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("\n"))
}

func (n *fakeNode) touch(t *testing.T, worker, times int) {
	t.Helper()
	for range times {
		if _, err := n.rt.Touch(n.worker(worker)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRegistrationAndHeartbeats(t *testing.T) {
	n := newFakeNode(t)
	reg := n.registry.registration(n.name)
	if reg == nil {
		waitFor(t, "registration", func() bool { reg = n.registry.registration(n.name); return reg != nil })
	}
	node := reg.GetNode()
	if node.GetAddress() != n.url || !slices.Equal(node.GetSandboxClasses(), []string{fake.Class}) || node.GetMetadata().GetLabels()["zone"] != "a" {
		t.Errorf("node registered as %v, want address %s, class %s, label zone=a", node, n.url, fake.Class)
	}
	if len(reg.GetWorkers()) != 2 {
		t.Fatalf("registered %d workers, want 2", len(reg.GetWorkers()))
	}
	for i, w := range reg.GetWorkers() {
		slot, _ := n.net.Slot(context.Background(), n.worker(i), i)
		m, s := w.GetMetadata(), w.GetSpec()
		if m.GetName() != n.worker(i) || m.GetSpace() != validate.WorkerNamespace || s.GetNode() != n.name || s.GetIp() != slot.IP ||
			s.GetPool() != "p" || s.GetSandboxClass() != fake.Class || m.GetLabels()["zone"] != "a" {
			t.Errorf("worker %d registered as %v", i, w)
		}
	}
	heartbeats := func() int {
		n.registry.mu.Lock()
		defer n.registry.mu.Unlock()
		return n.registry.heartbeats[n.name]
	}
	waitFor(t, "heartbeats", func() bool { return heartbeats() >= 3 })
	for i := range 2 {
		w, err := n.agent.member.registeredWorker(context.Background(), n.worker(i))
		if err != nil || w.GetMetadata().GetUid() != "uid-"+n.worker(i) || w.GetMetadata().GetSpace() != validate.WorkerNamespace {
			t.Errorf("registered worker %d: %v (%v), want the registry's record with uid uid-%s", i, w, err, n.worker(i))
		}
	}
	if w, err := n.agent.member.registeredWorker(context.Background(), "other-w0"); err == nil {
		t.Errorf("a worker the node does not have: %v, want an error", w)
	}

	// A control plane that lost the node gets it back.
	n.registry.forget(n.name, nil)
	waitFor(t, "re-registration", func() bool { return n.registry.registration(n.name) != nil })
}

func TestReregistrationDropsWorkloadsTheControlPlaneGaveUpOn(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	for i, actor := range []string{"a1", "a2"} {
		if _, err := n.run(ctx, actor, "op-"+actor, i); err != nil {
			t.Fatal(err)
		}
	}
	// The node was out of touch: the control plane crashed a2 and
	// released its worker, and kept a1 where it is.
	n.registry.forget(n.name, map[string]string{n.worker(0): "a1"})
	waitFor(t, "re-registration", func() bool { return n.registry.registration(n.name) != nil })
	// The slot is released before the volumes are removed: wait for both.
	waitFor(t, "a2's workload and volumes to go", func() bool {
		_, err := os.Stat(n.volumeDir("a2"))
		return n.stats(t, 1).GetActorUid() == "" && os.IsNotExist(err)
	})
	if st := n.stats(t, 1); st.GetRunning() {
		t.Fatalf("stats %v: a2's sandbox still runs", st)
	}
	if st := n.stats(t, 0); !st.GetRunning() || st.GetActorUid() != "a1" {
		t.Fatalf("stats %v: a1, still placed, was disturbed", st)
	}
	// The freed worker takes a new actor.
	if _, err := n.run(ctx, "a3", "op-a3", 1); err != nil {
		t.Fatal(err)
	}
}

func TestRunIsIdempotent(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	first, err := n.run(ctx, "a1", "op-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	n.touch(t, 0, 2)
	again, err := n.run(ctx, "a1", "op-1", 0)
	if err != nil {
		t.Fatalf("retried Run: %v", err)
	}
	if first.Msg.GetWorkerIp() != again.Msg.GetWorkerIp() || first.Msg.GetWorkerIp() == "" {
		t.Fatalf("retry answered %q, first %q", again.Msg.GetWorkerIp(), first.Msg.GetWorkerIp())
	}
	if c := n.calls("Run", 0); c != 1 {
		t.Fatalf("runtime Run called %d times, want 1", c)
	}
	if st := n.stats(t, 0); !st.GetRunning() || st.GetActorUid() != "a1" || st.GetMemoryBytes() != 2 {
		t.Fatalf("stats %v: the workload was restarted or lost", st)
	}
	// The outcome survives the agent.
	n.restart(t)
	if _, err := n.run(ctx, "a1", "op-1", 0); err != nil {
		t.Fatalf("Run retried after a restart: %v", err)
	}
	if c := n.calls("Run", 0); c != 1 {
		t.Fatalf("runtime Run called %d times after restart, want 1", c)
	}
}

func TestConcurrentDuplicatesWaitForTheFirst(t *testing.T) {
	n := newFakeNode(t)
	release := n.rt.Hang("Run")
	const callers = 8
	var wg sync.WaitGroup
	ips := make([]string, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() {
			resp, err := n.run(context.Background(), "a1", "op-1", 0)
			if err == nil {
				ips[i] = resp.Msg.GetWorkerIp()
			}
			errs[i] = err
		})
	}
	waitFor(t, "the first Run to reach the runtime", func() bool { return n.calls("Run", 0) == 1 })
	release()
	wg.Wait()
	for i := range callers {
		if errs[i] != nil || ips[i] != ips[0] {
			t.Errorf("caller %d: %q, %v", i, ips[i], errs[i])
		}
	}
	if c := n.calls("Run", 0); c != 1 {
		t.Fatalf("runtime Run called %d times, want 1", c)
	}
}

func TestCallerGivingUpDoesNotCancelTheOperation(t *testing.T) {
	n := newFakeNode(t)
	release := n.rt.Hang("Run")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := n.run(ctx, "a1", "op-1", 0)
	if err == nil {
		t.Fatal("Run returned before the runtime did")
	}
	release()
	if _, err := n.run(context.Background(), "a1", "op-1", 0); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if c := n.calls("Run", 0); c != 1 {
		t.Fatalf("runtime Run called %d times, want 1", c)
	}
	if st := n.stats(t, 0); !st.GetRunning() || st.GetActorUid() != "a1" {
		t.Fatalf("stats %v, want a1 running", st)
	}
}

func TestHungRuntimeFailsTheOperation(t *testing.T) {
	n := newFakeNode(t, func(c *Config) { c.OperationTimeout = 200 * time.Millisecond })
	defer n.rt.Hang("Run")()
	_, err := n.run(context.Background(), "a1", "op-1", 0)
	wantCode(t, err, connect.CodeDeadlineExceeded)
	if st := n.stats(t, 0); st.GetRunning() || st.GetActorUid() != "" {
		t.Fatalf("stats %v after a hung Run, want free", st)
	}
	if n.calls("Terminate", 0) != 1 {
		t.Fatalf("the hung start was not cleaned up: %v", n.rt.Calls())
	}
	if _, err := n.run(context.Background(), "a1", "op-2", 0); err != nil {
		t.Fatalf("Run after a hung one: %v", err)
	}
}

func TestFailuresAreRecorded(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	n.rt.FailNext("Run", errors.New("sandbox exploded"))
	_, err := n.run(ctx, "a1", "op-1", 0)
	wantCode(t, err, connect.CodeInternal)
	if !strings.Contains(err.Error(), "sandbox exploded") {
		t.Fatalf("error %v does not carry the runtime's", err)
	}
	// The retry gets the same outcome without running again.
	_, again := n.run(ctx, "a1", "op-1", 0)
	if again == nil || again.Error() != err.Error() || connect.CodeOf(again) != connect.CodeOf(err) {
		t.Fatalf("retry answered %v, want %v", again, err)
	}
	if c := n.calls("Run", 0); c != 1 {
		t.Fatalf("runtime Run called %d times, want 1", c)
	}
	// The failed start left the worker free and no volumes behind.
	if st := n.stats(t, 0); st.GetRunning() || st.GetActorUid() != "" {
		t.Fatalf("stats %v after a failed Run, want free", st)
	}
	if _, err := os.Stat(n.volumeDir("a1")); !os.IsNotExist(err) {
		t.Fatalf("volumes left after a failed Run: %v", err)
	}
	// A new operation runs.
	if _, err := n.run(ctx, "a1", "op-2", 0); err != nil {
		t.Fatal(err)
	}
	// Reusing an operation id for another method is refused.
	err = n.terminate(ctx, "a1", "op-2", 0)
	wantCode(t, err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), "must not be reused") {
		t.Fatalf("error %v does not explain the reuse", err)
	}
}

func TestSlotsHostOneActor(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-1", 0); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		actor   string
		worker  int
		wantMsg string
	}{
		{"another actor on a busy worker", "a2", 0, "busy with actor a1"},
		{"the same actor on a second worker", "a1", 1, "already occupies worker " + n.worker(0)},
		{"the same actor again on its worker", "a1", 0, "already occupies worker " + n.worker(0)},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := n.run(ctx, tt.actor, fmt.Sprintf("op-busy-%d", i), tt.worker)
			wantCode(t, err, connect.CodeFailedPrecondition)
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("error %v, want it to say %q", err, tt.wantMsg)
			}
		})
	}
	if c := n.calls("Run", 0) + n.calls("Run", 1); c != 1 {
		t.Fatalf("runtime Run called %d times, want 1", c)
	}
	if st := n.stats(t, 0); !st.GetRunning() || st.GetActorUid() != "a1" {
		t.Fatalf("stats %v: a1 was disturbed", st)
	}
}

func TestTerminate(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-1", 0); err != nil {
		t.Fatal(err)
	}
	n.touch(t, 0, 1)

	err := n.terminate(ctx, "a2", "op-t1", 0)
	wantCode(t, err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), "hosts actor a1, not a2") {
		t.Fatalf("error %v does not name the actors", err)
	}
	if st := n.stats(t, 0); !st.GetRunning() || st.GetActorUid() != "a1" {
		t.Fatalf("stats %v: terminate of another actor stopped a1", st)
	}
	if n.calls("Terminate", 0) != 0 {
		t.Fatal("the runtime was asked to terminate another actor's workload")
	}

	if err := n.terminate(ctx, "a1", "op-t2", 0); err != nil {
		t.Fatal(err)
	}
	if st := n.stats(t, 0); st.GetRunning() || st.GetActorUid() != "" {
		t.Fatalf("stats %v after terminate, want free", st)
	}
	if _, err := os.Stat(n.volumeDir("a1")); !os.IsNotExist(err) {
		t.Fatalf("volumes of a terminated actor left: %v", err)
	}
	terminations := n.calls("Terminate", 0)
	if err := n.terminate(ctx, "a1", "op-t2", 0); err != nil {
		t.Fatalf("retried terminate: %v", err)
	}
	if err := n.terminate(ctx, "a1", "op-t3", 0); err != nil {
		t.Fatalf("terminate of an actor already gone: %v", err)
	}
	if n.calls("Terminate", 0) != terminations {
		t.Fatal("terminating a free worker called the runtime")
	}
	// A worker freed by another actor's terminate is not refused later.
	if _, err := n.run(ctx, "a2", "op-2", 0); err != nil {
		t.Fatal(err)
	}
	err = n.terminate(ctx, "a1", "op-t4", 0)
	wantCode(t, err, connect.CodeFailedPrecondition)
}

func TestRestartAdoptsAndCleansUp(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-1", 0); err != nil {
		t.Fatal(err)
	}
	n.touch(t, 0, 2)
	if _, err := n.run(ctx, "a2", "op-2", 1); err != nil {
		t.Fatal(err)
	}
	// While the agent is down, a2's workload dies with its sandbox.
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	if err := n.rt.Terminate(ctx, runtime.Slot{Name: n.worker(1)}); err != nil {
		t.Fatal(err)
	}
	runsBefore := n.calls("Run", 0)
	n.start(t)

	// a1 is adopted: same workload, memory intact, not run again.
	if st := n.stats(t, 0); !st.GetRunning() || st.GetActorUid() != "a1" || st.GetMemoryBytes() != 2 {
		t.Fatalf("stats %v, want a1 adopted with its memory", st)
	}
	if n.calls("Run", 0) != runsBefore || n.calls("Terminate", 0) != 0 {
		t.Fatalf("adopting a1 ran or terminated it: %v", n.rt.Calls())
	}
	if _, err := n.run(ctx, "a1", "op-1", 0); err != nil {
		t.Fatalf("retry of a1's run after restart: %v", err)
	}
	n.touch(t, 0, 1)
	if lines := n.touchLines(t, "a1"); lines != 3 {
		t.Fatalf("a1's volume has %d lines, want 3", lines)
	}
	// a2's slot is free, its volumes gone.
	if st := n.stats(t, 1); st.GetRunning() || st.GetActorUid() != "" {
		t.Fatalf("stats %v, want worker 1 free", st)
	}
	if _, err := os.Stat(n.volumeDir("a2")); !os.IsNotExist(err) {
		t.Fatalf("volumes of a lost workload left: %v", err)
	}

	t.Run("UnknownSandboxesAndStrayVolumes", func(t *testing.T) {
		if err := n.stop(); err != nil {
			t.Fatal(err)
		}
		// Left by an operation the agent did not live to record: a
		// sandbox in a free slot, one in a slot this node no longer has,
		// and volumes of an actor no slot hosts.
		w := runtime.Workload{ActorUID: "a3", Template: n.tmpl, Rootfs: map[string]string{"app": t.TempDir()}, Volumes: map[string]string{"data": t.TempDir()}}
		for _, name := range []string{n.worker(1), WorkerName(n.name, 7)} {
			if err := n.rt.Run(ctx, runtime.Slot{Name: name}, w); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(filepath.Join(n.volumeDir("a3"), "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		n.start(t)
		sandboxes, err := n.rt.Sandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(sandboxes, []string{n.worker(0)}) {
			t.Fatalf("sandboxes after restart: %v, want only a1's", sandboxes)
		}
		if _, err := os.Stat(n.volumeDir("a3")); !os.IsNotExist(err) {
			t.Fatalf("stray volumes left: %v", err)
		}
		if _, err := os.Stat(n.volumeDir("a1")); err != nil {
			t.Fatalf("a1's volumes were removed: %v", err)
		}
	})

	t.Run("ASandboxThatCannotBeRemovedHoldsItsWorkerNotTheNode", func(t *testing.T) {
		if err := n.stop(); err != nil {
			t.Fatal(err)
		}
		w := runtime.Workload{ActorUID: "a4", Template: n.tmpl, Rootfs: map[string]string{"app": t.TempDir()}, Volumes: map[string]string{"data": t.TempDir()}}
		if err := n.rt.Run(ctx, runtime.Slot{Name: n.worker(1)}, w); err != nil {
			t.Fatal(err)
		}
		// The first removal and its first retry fail.
		for range 2 {
			n.rt.FailNext("Terminate", errors.New("runsc delete: loading container: unexpected end of JSON input"))
		}
		n.registry.forget(n.name, map[string]string{n.worker(0): "a1"})
		n.start(t)
		waitFor(t, "registration", func() bool { return n.registry.registration(n.name) != nil })
		if got := workerNames(n.registry.registration(n.name)); !slices.Equal(got, []string{n.worker(0)}) {
			t.Fatalf("registered workers %v, want only %s while %s is out of service", got, n.worker(0), n.worker(1))
		}
		if st := n.stats(t, 0); !st.GetRunning() || st.GetActorUid() != "a1" {
			t.Fatalf("stats %v: a1 was not adopted", st)
		}
		waitFor(t, "the worker back in service", func() bool {
			return slices.Equal(workerNames(n.registry.registration(n.name)), []string{n.worker(0), n.worker(1)})
		})
		if sandboxes, err := n.rt.Sandboxes(ctx); err != nil || !slices.Equal(sandboxes, []string{n.worker(0)}) {
			t.Fatalf("sandboxes %v (%v), want only a1's", sandboxes, err)
		}
	})
}

func workerNames(reg *torporv1.RegisterNodeRequest) []string {
	var names []string
	for _, w := range reg.GetWorkers() {
		names = append(names, w.GetMetadata().GetName())
	}
	return names
}

func TestOneAgentPerStateDir(t *testing.T) {
	n := newFakeNode(t)
	cfg := n.cfg
	cfg.Listen = "127.0.0.1:0"
	second, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = second.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "in use by another node agent") {
		t.Fatalf("second agent on one state directory: %v", err)
	}
	if st := n.stats(t, 0); st.GetRunning() {
		t.Fatal("the refused agent touched the workers")
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	good := func() Config {
		objects, _ := snapshot.NewDirStore(t.TempDir())
		return Config{Name: "n1", ServerURL: "http://x", Listen: "127.0.0.1:0", Workers: 1, StateDir: t.TempDir(), Runtime: fake.New(), Snapshots: objects, Network: loopback{}}
	}
	tests := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"name", func(c *Config) { c.Name = "Not_A_Label" }, "name"},
		{"server", func(c *Config) { c.ServerURL = "" }, "server URL"},
		{"listen", func(c *Config) { c.Listen = "" }, "listen"},
		{"workers", func(c *Config) { c.Workers = 0 }, "workers"},
		{"state dir", func(c *Config) { c.StateDir = "" }, "state directory"},
		{"runtime", func(c *Config) { c.Runtime = nil }, "runtime"},
		{"snapshots", func(c *Config) { c.Snapshots = nil }, "snapshot storage"},
		{"network", func(c *Config) { c.Network = nil }, "network"},
		{"labels", func(c *Config) { c.Labels = map[string]string{"bad key!": "v"} }, "labels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good()
			tt.change(&cfg)
			if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: %v, want an error naming %s", err, tt.want)
			}
		})
	}
	if _, err := New(good()); err != nil {
		t.Fatalf("New with a good config: %v", err)
	}
}

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperAgent())
	}
	code := m.Run()
	for _, d := range testDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}
