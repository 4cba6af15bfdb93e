package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

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

func TestReadiness(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	slot, _ := n.net.Slot(ctx, n.worker(0), 0)

	// A workload that answers 503 a few times, then 200.
	ln, err := net.Listen("tcp", slot.IP+":0")
	if err != nil {
		t.Fatal(err)
	}
	var probes atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ready" {
			http.NotFound(w, r)
			return
		}
		if probes.Add(1) <= 3 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := int32(ln.Addr().(*net.TCPAddr).Port)

	withProbe := func(path string, port, timeout int32) *torporv1.Workload {
		w := n.workload("a1")
		w.Template = appTemplate(t)
		w.Template.Containers[0].ReadinessProbe = &torporv1.Probe{HttpGet: &torporv1.HTTPGetAction{Path: path, Port: port}, TimeoutSeconds: timeout}
		return w
	}
	if _, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("a1", "op-1", n.worker(0)), Workload: withProbe("/ready", port, 5)})); err != nil {
		t.Fatal(err)
	}
	if got := probes.Load(); got != 4 {
		t.Fatalf("probe answered %d times, want 4 (3 failures, then ready)", got)
	}
	if err := n.terminate(ctx, "a1", "op-t", 0); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	_, err = n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("a1", "op-2", n.worker(0)), Workload: withProbe("/missing", port, 1)}))
	wantCode(t, err, connect.CodeDeadlineExceeded)
	if took := time.Since(began); took < time.Second {
		t.Fatalf("readiness gave up after %v, before its 1s timeout", took)
	}
	for _, want := range []string{"actor s/actor-a1", "readiness probe GET http://" + net.JoinHostPort(slot.IP, fmt.Sprint(port)) + "/missing", "within 1s", "404"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if st := n.stats(t, 0); st.GetRunning() || st.GetActorUid() != "" {
		t.Fatalf("stats %v after a readiness timeout, want the workload terminated", st)
	}
	if _, err := os.Stat(n.volumeDir("a1")); !os.IsNotExist(err) {
		t.Fatalf("volumes left after a readiness timeout: %v", err)
	}
}

// A start waits for every container's probe, whatever its kind: a TCP
// port that accepts connections only later, and a command that fails a
// few times before it exits 0.
func TestReadinessOfEveryContainer(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	slot, _ := n.net.Slot(ctx, n.worker(0), 0)
	// A port that is free now; the "workload" listens on it later.
	ln, err := net.Listen("tcp", slot.IP+":0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	port := int32(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	// Set before the port listens: a probe that passes comes after it.
	var listened atomic.Bool
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		// Not before the exec probe has run: the start waits for both.
		for !slices.ContainsFunc(n.rt.Calls(), func(c fake.Call) bool { return c.Method == "Exec" }) {
			time.Sleep(time.Millisecond)
		}
		listened.Store(true)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { ln.Close() })
	}()
	for range 3 {
		n.rt.FailNext("Exec", errors.New("exit status 1: not yet"))
	}
	w := n.workload("a1")
	w.Template = appTemplate(t)
	w.Template.Containers[0].ReadinessProbe = &torporv1.Probe{TcpSocket: &torporv1.TCPSocketAction{Port: port}, TimeoutSeconds: 30}
	side := proto.Clone(w.Template.Containers[0]).(*torporv1.Container)
	side.Name = "side"
	side.ReadinessProbe = &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/app", "ping"}}, TimeoutSeconds: 30}
	w.Template.Containers = append(w.Template.Containers, side)
	if _, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("a1", "op-1", n.worker(0)), Workload: w})); err != nil {
		t.Fatal(err)
	}
	if !listened.Load() {
		t.Fatal("the start returned before the TCP probe's port listened")
	}
	<-listening
	var execs []fake.Call
	for _, c := range n.rt.Calls() {
		if c.Method == "Exec" {
			execs = append(execs, c)
		}
	}
	if len(execs) != 4 {
		t.Fatalf("exec probe ran %d times, want 4 (3 failures, then ready)", len(execs))
	}
	for _, c := range execs {
		if c.Container != "side" || !slices.Equal(c.Cmd, []string{"/app", "ping"}) {
			t.Fatalf("exec probe ran %q in container %q, want /app ping in side", c.Cmd, c.Container)
		}
	}
	if err := n.terminate(ctx, "a1", "op-t", 0); err != nil {
		t.Fatal(err)
	}

	// A probe that never passes fails the start, naming its container.
	w.Template.Containers[1].ReadinessProbe = &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/app", "ping"}}, TimeoutSeconds: 1, PeriodSeconds: 1}
	// More failures than attempts fit in the timeout.
	for range 5 {
		n.rt.FailNext("Exec", errors.New("exit status 1: not ready"))
	}
	_, err = n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("a1", "op-2", n.worker(0)), Workload: w}))
	wantCode(t, err, connect.CodeDeadlineExceeded)
	for _, want := range []string{"container side", `readiness probe exec ["/app" "ping"]`, "not ready"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestCheckpointAndRestore(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	n.touch(t, 0, 3)

	checkpoint := func(t *testing.T, opID string, worker int, scope torporv1.SnapshotScope, target torporv1.CheckpointTarget) *torporv1.SnapshotSource {
		t.Helper()
		location := "s/a1/" + opID
		resp, err := n.client.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{Op: op("a1", opID, n.worker(worker)), Scope: scope, Target: target, Location: location}))
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Msg.GetHasData() || resp.Msg.GetLocation() != location || !strings.HasPrefix(resp.Msg.GetManifestDigest(), "sha256:") {
			t.Fatalf("checkpoint response %v", resp.Msg)
		}
		if st := n.stats(t, worker); st.GetRunning() || st.GetActorUid() != "" {
			t.Fatalf("stats %v after checkpoint, want the worker free", st)
		}
		src := &torporv1.SnapshotSource{Location: location, ManifestDigest: resp.Msg.GetManifestDigest()}
		if target == torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL {
			src.Node = n.name
		}
		return src
	}
	restore := func(t *testing.T, opID string, worker int, scope torporv1.RestoreScope, snap, golden *torporv1.SnapshotSource) {
		t.Helper()
		resp, err := n.client.Restore(ctx, connect.NewRequest(&torporv1.RestoreRequest{Op: op("a1", opID, n.worker(worker)), Workload: n.workload("a1"), Scope: scope, Snapshot: snap, Golden: golden}))
		if err != nil {
			t.Fatal(err)
		}
		if slot, _ := n.net.Slot(ctx, n.worker(worker), worker); resp.Msg.GetWorkerIp() != slot.IP {
			t.Fatalf("restored at %s, want %s", resp.Msg.GetWorkerIp(), slot.IP)
		}
	}
	wantState := func(t *testing.T, worker int, memory int64, lines int) {
		t.Helper()
		if st := n.stats(t, worker); !st.GetRunning() || st.GetActorUid() != "a1" || st.GetMemoryBytes() != memory {
			t.Fatalf("stats %v, want a1 running with memory %d", st, memory)
		}
		if got := n.touchLines(t, "a1"); got != lines {
			t.Fatalf("%d lines in the volume, want %d", got, lines)
		}
	}

	full := checkpoint(t, "op-full", 0, torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE)
	restore(t, "op-r1", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, full, nil)
	wantState(t, 1, 3, 3)
	n.touch(t, 1, 1)

	data := checkpoint(t, "op-data", 1, torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA, torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE)
	restore(t, "op-r2", 0, torporv1.RestoreScope_RESTORE_SCOPE_DATA, data, nil)
	wantState(t, 0, 0, 4)

	local := checkpoint(t, "op-local", 0, torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL)
	restore(t, "op-r3", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, local, nil)
	wantState(t, 1, 0, 4)
	// Resumed, the actor is past its local checkpoint: the node drops it.
	waitFor(t, "the local checkpoint to be dropped", func() bool {
		_, err := os.Stat(filepath.Join(n.cfg.StateDir, "local", local.GetLocation()))
		return os.IsNotExist(err)
	})

	if err := n.terminate(ctx, "a1", "op-t", 1); err != nil {
		t.Fatal(err)
	}
	restore(t, "op-r4", 1, torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN, data, full)
	wantState(t, 1, 3, 4)

	t.Run("NewActorOnGolden", func(t *testing.T) {
		// An actor without a snapshot of its own: the golden's memory and
		// empty volumes.
		_, err := n.client.Restore(ctx, connect.NewRequest(&torporv1.RestoreRequest{
			Op: op("a2", "op-g", n.worker(0)), Workload: n.workload("a2"),
			Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN, Golden: full,
		}))
		if err != nil {
			t.Fatal(err)
		}
		if st := n.stats(t, 0); st.GetActorUid() != "a2" || st.GetMemoryBytes() != 3 {
			t.Fatalf("stats %v, want a2 with the golden's memory 3", st)
		}
		entries, err := os.ReadDir(filepath.Join(n.volumeDir("a2"), "data"))
		if err != nil || len(entries) != 0 {
			t.Fatalf("a2's volume: %v, %v; want it empty", entries, err)
		}
		if err := n.terminate(ctx, "a2", "op-g-t", 0); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Errors", func(t *testing.T) {
		tests := []struct {
			name    string
			req     *torporv1.RestoreRequest
			code    connect.Code
			wantMsg string
		}{
			{"FULL from a DATA snapshot", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: data}, connect.CodeFailedPrecondition, "holds no memory image"},
			{"local checkpoint of another node", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: &torporv1.SnapshotSource{Location: local.GetLocation(), ManifestDigest: local.GetManifestDigest(), Node: "n2"}}, connect.CodeFailedPrecondition, "local checkpoint on node n2"},
			{"wrong digest", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: &torporv1.SnapshotSource{Location: full.GetLocation(), ManifestDigest: data.GetManifestDigest()}}, connect.CodeDataLoss, "digest mismatch"},
			{"missing snapshot", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA, Snapshot: &torporv1.SnapshotSource{Location: "s/a1/none", ManifestDigest: full.GetManifestDigest()}}, connect.CodeDataLoss, "s/a1/none"},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				// Another actor: a1 runs on worker 1.
				tt.req.Op = op("a9", fmt.Sprintf("op-bad-%d", i), n.worker(0))
				tt.req.Workload = n.workload("a9")
				_, err := n.client.Restore(ctx, connect.NewRequest(tt.req))
				wantCode(t, err, tt.code)
				if !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("error %v, want it to say %q", err, tt.wantMsg)
				}
				if st := n.stats(t, 0); st.GetRunning() || st.GetActorUid() != "" {
					t.Fatalf("stats %v after a failed restore, want free", st)
				}
			})
		}
		// Checkpointing a worker the actor is not on.
		_, err := n.client.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{Op: op("a1", "op-c-bad", n.worker(0)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: "s/a1/x"}))
		wantCode(t, err, connect.CodeFailedPrecondition)
	})

	t.Run("FailedCheckpointKeepsTheWorkload", func(t *testing.T) {
		n.rt.FailNext("Checkpoint", errors.New("disk full"))
		_, err := n.client.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{Op: op("a1", "op-c-fail", n.worker(1)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: "s/a1/fail"}))
		if err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Fatalf("checkpoint error %v, want the runtime's", err)
		}
		wantState(t, 1, 3, 4)
		if _, err := snapshot.ReadManifest(ctx, n.cfg.Snapshots, "s/a1/fail", full.GetManifestDigest()); !errors.Is(err, snapshot.ErrDataLoss) {
			t.Fatalf("a failed checkpoint left a snapshot: %v", err)
		}
	})
}

func TestBadRequests(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	good := func() *torporv1.RunRequest {
		return &torporv1.RunRequest{Op: op("a1", "op-1", n.worker(0)), Workload: n.workload("a1")}
	}
	tests := []struct {
		name   string
		change func(*torporv1.RunRequest)
		code   connect.Code
		field  string
	}{
		{"no op", func(r *torporv1.RunRequest) { r.Op = nil }, connect.CodeInvalidArgument, "op"},
		{"no actor uid", func(r *torporv1.RunRequest) { r.Op.ActorUid = "" }, connect.CodeInvalidArgument, "op.actorUid"},
		{"path in operation id", func(r *torporv1.RunRequest) { r.Op.OperationId = "../../etc" }, connect.CodeInvalidArgument, "op.operationId"},
		{"no worker", func(r *torporv1.RunRequest) { r.Op.Worker = "" }, connect.CodeInvalidArgument, "op.worker"},
		{"unknown worker", func(r *torporv1.RunRequest) { r.Op.Worker = "n1-w9" }, connect.CodeNotFound, "worker n1-w9 is not on node n1"},
		{"other actor's workload", func(r *torporv1.RunRequest) { r.Workload.ActorUid = "a2" }, connect.CodeInvalidArgument, "workload.actorUid"},
		{"no containers", func(r *torporv1.RunRequest) { r.Workload.Template = &torporv1.TemplateSpec{} }, connect.CodeInvalidArgument, "workload.template.containers"},
		{"unpinned image", func(r *torporv1.RunRequest) {
			r.Workload.Template = appTemplate(t)
			r.Workload.Template.Containers[0].Image = "oci:/somewhere:latest"
		}, connect.CodeInvalidArgument, "workload.template.containers[0].image"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := good()
			tt.change(req)
			_, err := n.client.Run(ctx, connect.NewRequest(req))
			wantCode(t, err, tt.code)
			if !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("error %v does not name %s", err, tt.field)
			}
		})
	}
	restoreTests := []struct {
		name  string
		req   *torporv1.RestoreRequest
		field string
	}{
		{"BOOT", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_BOOT}, "scope"},
		{"FULL without snapshot", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL}, "snapshot"},
		{"DATA_ON_GOLDEN without golden", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN}, "golden"},
		{"bad location", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA, Snapshot: &torporv1.SnapshotSource{Location: "../x", ManifestDigest: "sha256:00"}}, "snapshot.location"},
		{"no digest", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA, Snapshot: &torporv1.SnapshotSource{Location: "s/a1/x"}}, "snapshot.manifestDigest"},
	}
	for _, tt := range restoreTests {
		t.Run("restore "+tt.name, func(t *testing.T) {
			tt.req.Op, tt.req.Workload = op("a1", "op-r", n.worker(0)), n.workload("a1")
			_, err := n.client.Restore(ctx, connect.NewRequest(tt.req))
			wantCode(t, err, connect.CodeInvalidArgument)
			if !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("error %v does not name %s", err, tt.field)
			}
		})
	}
	checkpointTests := []struct {
		name  string
		req   *torporv1.CheckpointRequest
		field string
	}{
		{"no scope", &torporv1.CheckpointRequest{Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: "s/a1/x"}, "scope"},
		{"no target", &torporv1.CheckpointRequest{Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Location: "s/a1/x"}, "target"},
		{"bad location", &torporv1.CheckpointRequest{Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: "s/a1"}, "location"},
	}
	for _, tt := range checkpointTests {
		t.Run("checkpoint "+tt.name, func(t *testing.T) {
			tt.req.Op = op("a1", "op-c", n.worker(0))
			_, err := n.client.Checkpoint(ctx, connect.NewRequest(tt.req))
			wantCode(t, err, connect.CodeInvalidArgument)
			if !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("error %v does not name %s", err, tt.field)
			}
		})
	}
	if c := len(n.rt.Calls()); slices.ContainsFunc(n.rt.Calls(), func(c fake.Call) bool { return c.Method != "Sandboxes" && c.Method != "Stats" }) {
		t.Fatalf("bad requests reached the runtime (%d calls): %v", c, n.rt.Calls())
	}
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
