package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// The test network: a node name, bridge and subnet of this test process
// alone, so other test processes on this host (another package, another
// checkout) never collide with these.
var (
	testNode   = fmt.Sprintf("gv%05d", os.Getpid()%100000)
	testBridge = "tp" + testNode
	testCIDR   = fmt.Sprintf("10.253.%d.0/24", os.Getpid()%256)
)

const port = 8080

// counterBinary is the static test workload, built once by TestMain.
var counterBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gvisor-counter-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	counterBinary = filepath.Join(dir, "counter")
	code := func() int {
		defer os.RemoveAll(dir)
		// go test puts its own go first in PATH.
		build := exec.Command("go", "build", "-ldflags=-s -w", "-o", counterBinary, "./testdata/counter")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building the test workload: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

type harness struct {
	rt     *Runtime
	net    *netns.Network
	slots  [2]runtime.Slot
	rootfs string
	root   string
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	runtimetest.RequireRoot(t)
	runsc := runtimetest.Runsc(t)
	ctx := context.Background()
	h := &harness{root: t.TempDir(), rootfs: filepath.Join(t.TempDir(), "rootfs")}
	if err := os.MkdirAll(filepath.Join(h.rootfs, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(counterBinary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.rootfs, "bin", "counter"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	h.net, err = netns.New(netns.Config{Node: testNode, Bridge: testBridge, CIDR: testCIDR})
	if err != nil {
		t.Fatal(err)
	}
	// Leftovers of a crashed earlier run would collide.
	if err := h.net.TeardownAll(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range h.slots {
		if h.slots[i], err = h.net.Slot(ctx, fmt.Sprintf("w%d", i), i); err != nil {
			t.Fatal(err)
		}
	}
	h.rt, err = New(Config{ConfigureNetwork: netns.Configure, Runsc: runsc, RootDir: h.root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range h.slots {
			if err := h.rt.Terminate(ctx, s); err != nil {
				t.Error(err)
			}
		}
		if err := h.rt.Close(ctx); err != nil {
			t.Error(err)
		}
		if err := h.net.TeardownAll(ctx); err != nil {
			t.Error(err)
		}
	})
	return h
}

// workload returns the counter with a fresh durable volume at /data.
func (h *harness) workload(t testing.TB) runtime.Workload {
	return runtime.Workload{
		ActorUID: "actor-uid-1", Space: "default", Actor: "counter",
		Template: &torporv1.TemplateSpec{
			Containers: []*torporv1.Container{{
				Name:    "main",
				Command: []string{"/bin/counter"},
				Env:     []*torporv1.EnvVar{{Name: "GREETING", Value: "hello"}},
				Mounts:  []*torporv1.Mount{{Volume: "data", Path: "/data"}},
			}},
			Volumes: []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
		},
		Rootfs:  map[string]string{"main": h.rootfs},
		Volumes: map[string]string{"data": t.TempDir()},
	}
}

// sidePort is where the pod's second container serves.
const sidePort = 8081

// pod returns the workload with a second container, "side": the counter
// again on sidePort, mounting the same volume at /data, so both append to
// one file there.
func (h *harness) pod(t testing.TB) runtime.Workload {
	w := h.workload(t)
	w.Template.Containers = append(w.Template.Containers, &torporv1.Container{
		Name:    "side",
		Command: []string{"/bin/counter"},
		Env:     []*torporv1.EnvVar{{Name: "PORT", Value: strconv.Itoa(sidePort)}, {Name: "GREETING", Value: "side"}},
		Mounts:  []*torporv1.Mount{{Volume: "data", Path: "/data"}},
	})
	w.Rootfs["side"] = h.rootfs
	return w
}

// client opens a connection per request: a restored sandbox carries the
// TCP state of the connections its original had, so a kept-alive
// connection can reach a workload that moved and make the transport retry
// a request the workload already counted.
var client = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func get(ip, path string) (string, error) { return getPort(ip, port, path) }

func getPort(ip string, port int, path string) (string, error) {
	resp, err := client.Get(fmt.Sprintf("http://%s:%d%s", ip, port, path))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, body)
	}
	return strings.TrimSpace(string(body)), err
}

// waitReady polls the workload's health endpoint, as a node does.
func waitReady(t testing.TB, ip string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := get(ip, "/healthz")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("workload at %s not ready: %v", ip, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func request(t testing.TB, ip string) string {
	t.Helper()
	body, err := get(ip, "/")
	if err != nil {
		t.Fatalf("request to %s: %v", ip, err)
	}
	return body
}

func TestNewValidatesConfig(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"no runsc", Config{RootDir: t.TempDir()}, "runsc: no path"},
		{"missing runsc", Config{Runsc: "/nonexistent/runsc", RootDir: t.TempDir()}, "runsc:"},
		{"runsc is a dir", Config{Runsc: t.TempDir(), RootDir: t.TempDir()}, "not an executable"},
		{"no root", Config{Runsc: exe}, "root dir: no path"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("New = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestConformance(t *testing.T) {
	h := newHarness(t)
	runtimetest.Conformance(t, runtimetest.Env{
		Runtime:  h.rt,
		Slots:    h.slots,
		Workload: func(t *testing.T) runtime.Workload { return h.workload(t) },
		Pod:      func(t *testing.T) runtime.Workload { return h.pod(t) },
		True:     []string{"/bin/counter", "exit", "0"},
	})
}

func TestCheckpointRestoreInAnotherSlot(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, b := h.slots[0], h.slots[1]
	w := h.workload(t)
	before := listTree(t, h.rootfs)

	if err := h.rt.Run(ctx, a, w); err != nil {
		t.Fatal(err)
	}
	waitReady(t, a.IP)
	for i := 1; i <= 3; i++ {
		if got, want := request(t, a.IP), fmt.Sprintf("count=%d volume=%d rootfs=%d greeting=hello", i, i, i); got != want {
			t.Fatalf("request %d: %q, want %q", i, got, want)
		}
	}
	st, err := h.rt.Stats(ctx, a)
	if err != nil || !st.Running || st.MemoryBytes <= 0 || time.Since(st.Started) > time.Minute {
		t.Fatalf("Stats(running) = %+v, %v", st, err)
	}
	img := filepath.Join(t.TempDir(), "image")
	if err := h.rt.Checkpoint(ctx, a, img, false); err != nil {
		t.Fatal(err)
	}
	if _, err := get(a.IP, "/healthz"); err == nil {
		t.Fatal("slot A still answers after a checkpoint that stops the sandbox")
	}
	if err := h.rt.Terminate(ctx, a); err != nil {
		t.Fatal(err)
	}

	if err := h.rt.Restore(ctx, b, w, img); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b.IP)
	// Memory (count), root filesystem overlay and volume all came back.
	if got, want := request(t, b.IP), "count=4 volume=4 rootfs=4 greeting=hello"; got != want {
		t.Fatalf("after restore: %q, want %q", got, want)
	}
	data, err := os.ReadFile(filepath.Join(w.Volumes["data"], "state.log"))
	if err != nil || strings.Count(string(data), "\n") != 4 {
		t.Fatalf("volume file on the host: %q, %v; want 4 lines", data, err)
	}
	if after := listTree(t, h.rootfs); !slices.Equal(before, after) {
		t.Fatalf("the shared rootfs changed on the host: %v -> %v", before, after)
	}
}

// Both containers of a pod keep their memory and root filesystem through a
// checkpoint and a restore, cold and into a warm sandbox, and share their
// volume and network all along.
func TestSeveralContainersCheckpointRestore(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, b := h.slots[0], h.slots[1]
	w := h.pod(t)
	requestBoth := func(ip string, want ...string) {
		t.Helper()
		for i, p := range []int{port, sidePort} {
			got, err := getPort(ip, p, "/")
			if err != nil {
				t.Fatalf("request to port %d: %v", p, err)
			}
			if got != want[i] {
				t.Fatalf("port %d: %q, want %q", p, got, want[i])
			}
		}
	}
	waitBoth := func(ip string) {
		t.Helper()
		waitReady(t, ip)
		for {
			if _, err := getPort(ip, sidePort, "/healthz"); err == nil {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	if err := h.rt.Run(ctx, a, w); err != nil {
		t.Fatal(err)
	}
	waitBoth(a.IP)
	// One volume: each container's line count includes the other's.
	requestBoth(a.IP, "count=1 volume=1 rootfs=1 greeting=hello", "count=1 volume=2 rootfs=1 greeting=side")
	requestBoth(a.IP, "count=2 volume=3 rootfs=2 greeting=hello", "count=2 volume=4 rootfs=2 greeting=side")

	img := t.TempDir()
	if err := h.rt.Checkpoint(ctx, a, img, false); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Restore(ctx, b, w, img); err != nil {
		t.Fatal(err)
	}
	waitBoth(b.IP)
	requestBoth(b.IP, "count=3 volume=5 rootfs=3 greeting=hello", "count=3 volume=6 rootfs=3 greeting=side")

	img = t.TempDir()
	if err := h.rt.Checkpoint(ctx, b, img, false); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Warm(ctx, a, w); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Restore(ctx, a, w, img); err != nil {
		t.Fatal(err)
	}
	if st, err := h.rt.Stats(ctx, a); err != nil || !st.Running || st.Warm {
		t.Fatalf("Stats after a restore into the warm sandbox = %+v, %v", st, err)
	}
	waitBoth(a.IP)
	requestBoth(a.IP, "count=4 volume=7 rootfs=4 greeting=hello", "count=4 volume=8 rootfs=4 greeting=side")

	// A capture that leaves the pod running: both go on, and the image
	// forks both, with a volume of its own.
	img = t.TempDir()
	if err := h.rt.Checkpoint(ctx, a, img, true); err != nil {
		t.Fatal(err)
	}
	requestBoth(a.IP, "count=5 volume=9 rootfs=5 greeting=hello", "count=5 volume=10 rootfs=5 greeting=side")
	fork := w
	fork.Volumes = map[string]string{"data": t.TempDir()}
	if err := h.rt.Terminate(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Restore(ctx, b, fork, img); err != nil {
		t.Fatal(err)
	}
	waitBoth(b.IP)
	requestBoth(b.IP, "count=5 volume=1 rootfs=5 greeting=hello", "count=5 volume=2 rootfs=5 greeting=side")

	// Nothing of either container is left once the sandbox is gone.
	for _, s := range h.slots {
		if err := h.rt.Terminate(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	known, err := h.rt.containers(ctx)
	if err != nil || len(known) != 0 {
		t.Fatalf("runsc still knows %v after Terminate (%v)", known, err)
	}
}

// An exec runs in the named container and fails with its exit status and
// output.
func TestExec(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a := h.slots[0]
	if err := h.rt.Run(ctx, a, h.pod(t)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"main", "side"} {
		if err := h.rt.Exec(ctx, a, name, []string{"/bin/counter", "exit", "0"}); err != nil {
			t.Fatalf("exec in %s: %v", name, err)
		}
		err := h.rt.Exec(ctx, a, name, []string{"/bin/counter", "exit", "3"})
		if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "exiting with 3") {
			t.Fatalf("exec exiting 3 in %s = %v, want its status and output", name, err)
		}
	}
	if err := h.rt.Exec(ctx, a, "main", []string{"/bin/absent"}); err == nil {
		t.Fatal("exec of a missing program succeeded")
	}
}

func TestCheckpointLeavingTheWorkloadRunning(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, b := h.slots[0], h.slots[1]
	w := h.workload(t)
	if err := h.rt.Run(ctx, a, w); err != nil {
		t.Fatal(err)
	}
	waitReady(t, a.IP)
	request(t, a.IP)
	request(t, a.IP)
	img := t.TempDir()
	if err := h.rt.Checkpoint(ctx, a, img, true); err != nil {
		t.Fatal(err)
	}
	if got := request(t, a.IP); !strings.HasPrefix(got, "count=3 ") {
		t.Fatalf("after a leave-running checkpoint: %q, want count=3", got)
	}
	// The image holds the state at checkpoint time; the restored copy
	// gets a volume of its own, as a fork would.
	fork := w
	fork.Volumes = map[string]string{"data": t.TempDir()}
	if err := h.rt.Restore(ctx, b, fork, img); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b.IP)
	if got := request(t, b.IP); !strings.HasPrefix(got, "count=3 volume=1 rootfs=3 ") {
		t.Fatalf("restored fork: %q, want count=3 volume=1 rootfs=3", got)
	}
}

func TestCrashedWorkload(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a := h.slots[0]
	w := h.workload(t)
	if err := h.rt.Run(ctx, a, w); err != nil {
		t.Fatal(err)
	}
	waitReady(t, a.IP)
	ids, err := h.rt.bundles(a.Name)
	if err != nil || len(ids) != 1 {
		t.Fatalf("bundles = %v, %v", ids, err)
	}
	out, err := h.rt.output(ctx, "state", ids[0])
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Pid int }
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("no pid in %s (%v)", out, err)
	}
	p, err := os.FindProcess(st.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := h.rt.Stats(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a killed sandbox still reported running")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := h.rt.Checkpoint(ctx, a, t.TempDir(), false); !errors.Is(err, runtime.ErrNotRunning) {
		t.Fatalf("Checkpoint of a dead sandbox = %v, want ErrNotRunning", err)
	}
	if err := h.rt.Run(ctx, a, w); !errors.Is(err, runtime.ErrBusy) {
		t.Fatalf("Run over a dead sandbox = %v, want ErrBusy", err)
	}
	if err := h.rt.Terminate(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Run(ctx, a, w); err != nil {
		t.Fatalf("Run after Terminate: %v", err)
	}
	waitReady(t, a.IP)
}
