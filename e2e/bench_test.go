package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/latency"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/node"
	"github.com/torpor-dev/torpor/internal/router"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/gvisor"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// BenchmarkActivation measures the design's activation latency on real
// gVisor: a request through the router for a suspended counter actor until
// its response arrives (resume through the control plane, the node agent's
// restore from the snapshot on local disk, readiness, proxying). Each
// iteration activates the actor twice and runs a baseline, interleaved:
//
//   - activation: the node agent warmed the worker the actor was suspended
//     out of (a sandbox made ahead for it, see node/warm.go), as it does
//     for an actor idle long enough to be suspended; the benchmark waits
//     for that warm-up, untimed.
//   - activation-cold: the same after the warm sandbox was removed behind
//     the agent's back, so the restore boots its sandbox (the path without
//     warm workers).
//   - runsc-restore: a plain `runsc restore` of a counter checkpoint to its
//     first response, in a slot of the same node network the agent does
//     not use, with the runtime's runsc flags.
//
// Percentiles need latency.Samples:
//
//	go test -run '^$' -bench Activation -benchtime=30x ./e2e
func BenchmarkActivation(b *testing.B) {
	c := newCluster(b, clusterOptions{backend: "sqlite", workersPerNode: 2})
	c.applyTemplate(counterTemplate(b, "counter", nil))
	c.createActor("bench", "counter")
	home, client := routedHome(b, c, "bench")
	// The first request restores the golden; from then on every resume
	// restores the actor's own last snapshot, as in steady state.
	requests := 1
	fetch(b, client, home)
	raw := newRawCounter(b, c, "raw", runtimetest.Runsc(b), 0)
	// TORPOR_BENCH_STOCK_RUNSC names a second runsc (such as one built by a
	// plain go install, without precompiled seccomp programs) whose plain
	// restore is measured too, interleaved: the same restore with and
	// without the build's levers, in one run.
	var stock *rawCounter
	if p := os.Getenv("TORPOR_BENCH_STOCK_RUNSC"); p != "" {
		stock = newRawCounter(b, c, "raw-stock", p, 1)
	}
	n := c.nodes[0]

	b.Run("suspended", func(b *testing.B) {
		var activation, cold, resumeStep, restore, restoreStock latency.Samples
		// The warm activations' phases, as their resume events record them.
		phases := map[string]*latency.Samples{}
		var calls float64
		activate := func(b *testing.B, warm bool) time.Duration {
			b.StopTimer()
			if _, err := c.actors.SuspendActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "bench"})); err != nil {
				b.Fatal(err)
			}
			slot := n.waitWarm(b)
			if !warm {
				if err := n.runtime.Terminate(c.ctx, slot); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
			took, body := fetch(b, client, home)
			requests++
			// FULL restores keep the count in memory and the lines on disk.
			if want := fmt.Sprintf("count=%d lines=%d", requests, requests); body != want {
				b.Fatalf("request %d after a suspend: %q, want %q", requests, body, want)
			}
			return took
		}
		for range b.N {
			before := requestCalls(b, c.router)
			activation.Add(activate(b, true))
			calls += requestCalls(b, c.router) - before
			step, reason := lastResume(b, c, "bench")
			resumeStep.Add(step)
			for name, d := range phasesOf(reason) {
				if phases[name] == nil {
					phases[name] = &latency.Samples{}
				}
				phases[name].Add(d)
			}
			cold.Add(activate(b, false))
			restore.Add(raw.cycle(b))
			if stock != nil {
				restoreStock.Add(stock.cycle(b))
			}
		}
		activation.Report(b, "activation", 0.50, 0.95)
		resumeStep.Report(b, "resume-step", 0.50, 0.95)
		cold.Report(b, "activation-cold", 0.50, 0.95)
		restore.Report(b, "runsc-restore", 0.50, 0.95)
		b.ReportMetric(activation.Millis(0.50)/restore.Millis(0.50), "p50-ratio")
		b.ReportMetric(activation.Millis(0.95)/restore.Millis(0.95), "p95-ratio")
		b.ReportMetric(activation.Millis(0.50)/cold.Millis(0.50), "warm/cold-p50")
		b.ReportMetric(activation.Millis(0.95)/cold.Millis(0.95), "warm/cold-p95")
		if stock != nil {
			restoreStock.Report(b, "runsc-restore-stock", 0.50, 0.95)
			b.ReportMetric(activation.Millis(0.50)/restoreStock.Millis(0.50), "p50-ratio-stock")
			b.ReportMetric(activation.Millis(0.95)/restoreStock.Millis(0.95), "p95-ratio-stock")
		}
		for name, samples := range phases {
			samples.Report(b, "phase-"+name, 0.50)
		}
		// Control-plane calls the router waited for per warm activation.
		b.ReportMetric(calls/float64(b.N), "cp-calls/activation")
	})
}

// waitWarm waits (untimed) until one of the node's workers is warm, and
// returns its slot.
func (n *nodeAgent) waitWarm(b *testing.B) runtime.Slot {
	b.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for i := range n.workers {
			slot, err := n.network.Slot(ctx, node.WorkerName(n.name, i), i)
			if err != nil {
				b.Fatal(err)
			}
			if st, err := n.runtime.Stats(ctx, slot); err == nil && st.Warm {
				return slot
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("no worker of the node got warm within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lastResume is how long the actor's last resume took in the control
// plane's own record, from its claim to RUNNING, the node's restore and
// readiness included, and its reason, which holds its phases.
func lastResume(b *testing.B, c *cluster, actor string) (time.Duration, string) {
	b.StopTimer()
	defer b.StartTimer()
	resp, err := c.actors.ListActorEvents(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: actor}))
	if err != nil {
		b.Fatal(err)
	}
	events := resp.Msg.GetEvents()
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].GetToState() == torporv1.ActorState_ACTOR_STATE_RUNNING {
			return time.Duration(events[i].GetDurationMs()) * time.Millisecond, events[i].GetReason()
		}
	}
	b.Fatalf("actor %s has no resume in its history", actor)
	return 0, ""
}

// resumePhase is one "name 1.2ms" of a resume event's reason.
var resumePhase = regexp.MustCompile(`([a-z]+) ([0-9.]+)ms`)

// phasesOf reads the phases out of a resume event's reason
// (workflow.resumedReason).
func phasesOf(reason string) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, m := range resumePhase.FindAllStringSubmatch(reason, -1) {
		ms, err := strconv.ParseFloat(m[2], 64)
		if err == nil {
			out[m[1]] = time.Duration(ms * float64(time.Millisecond))
		}
	}
	return out
}

// BenchmarkRouterRunning measures what the router adds per request for a
// RUNNING actor on gVisor: the same small request (the counter's /readyz)
// straight to the worker's address and through the router, alternately,
// each over its own keep-alive connection ("readyz": latency), and the
// answers per second of many clients at once each way ("throughput").
//
//	go test -run '^$' -bench RouterRunning -benchtime=3s ./e2e
func BenchmarkRouterRunning(b *testing.B) {
	c := newCluster(b, clusterOptions{backend: "sqlite", workersPerNode: 1})
	c.applyTemplate(counterTemplate(b, "counter", nil))
	c.createActor("bench", "counter")
	ip := c.mustResume("bench").GetStatus().GetWorker().GetIp()
	direct, err := http.NewRequest(http.MethodGet, "http://"+net.JoinHostPort(ip, "8080")+"/readyz", nil)
	if err != nil {
		b.Fatal(err)
	}
	routed, err := http.NewRequest(http.MethodGet, c.ingress+"/readyz", nil)
	if err != nil {
		b.Fatal(err)
	}
	routed.Header.Set(router.ActorHeader, "default/bench")
	directClient, routedClient := &http.Client{Transport: &http.Transport{}}, &http.Client{Transport: &http.Transport{}}
	b.Cleanup(directClient.CloseIdleConnections)
	b.Cleanup(routedClient.CloseIdleConnections)

	b.Run("readyz", func(b *testing.B) {
		var viaDirect, viaRouter latency.Samples
		calls := requestCalls(b, c.router)
		for b.Loop() {
			took, _ := fetch(b, directClient, direct)
			viaDirect.Add(took)
			took, _ = fetch(b, routedClient, routed)
			viaRouter.Add(took)
		}
		viaDirect.ReportMicros(b, "direct", 0.50, 0.95)
		viaRouter.ReportMicros(b, "router", 0.50, 0.95)
		b.ReportMetric((viaRouter.Millis(0.50)-viaDirect.Millis(0.50))*1000, "added-p50-us")
		b.ReportMetric(viaRouter.Millis(0.50)/viaDirect.Millis(0.50), "p50-ratio")
		// Control-plane calls per proxied request: the placement watch
		// makes it 0 for a running actor.
		b.ReportMetric((requestCalls(b, c.router)-calls)/float64(len(viaRouter)), "cp-calls/req")
	})

	// Keep-alive throughput: throughputClients clients, each on its own
	// connection, send as fast as answers come, for a second straight to
	// the worker and then a second through the router, per iteration.
	b.Run("throughput", func(b *testing.B) {
		var directN, routedN int
		var directT, routedT time.Duration
		for b.Loop() {
			n, took := saturate(b, direct, time.Second)
			directN, directT = directN+n, directT+took
			n, took = saturate(b, routed, time.Second)
			routedN, routedT = routedN+n, routedT+took
		}
		directRate, routedRate := float64(directN)/directT.Seconds(), float64(routedN)/routedT.Seconds()
		b.ReportMetric(directRate, "direct-req/s")
		b.ReportMetric(routedRate, "router-req/s")
		b.ReportMetric(routedRate/directRate, "throughput-ratio")
	})
}

// throughputClients is how many keep-alive connections saturate sends on
// at once: enough to keep both CPUs of the test machine busy.
const throughputClients = 8

// saturate sends req from throughputClients clients, each over its own
// keep-alive connection, for about d; it returns how many answers (each a
// 200, read whole) came and how long that took.
func saturate(b *testing.B, req *http.Request, d time.Duration) (int, time.Duration) {
	b.Helper()
	var total atomic.Int64
	var g errgroup.Group
	start := time.Now()
	deadline := start.Add(d)
	for range throughputClients {
		client := &http.Client{Transport: &http.Transport{}}
		g.Go(func() error {
			defer client.CloseIdleConnections()
			for time.Now().Before(deadline) {
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil {
					return err
				}
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("GET %s: %s", req.URL, resp.Status)
				}
				total.Add(1)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	return int(total.Load()), time.Since(start)
}

// fetch sends req and reads the whole answer, which must be a 200.
func fetch(tb testing.TB, client *http.Client, req *http.Request) (time.Duration, string) {
	tb.Helper()
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(t0)
	if err != nil {
		tb.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("GET %s: %s %s", req.URL, resp.Status, body)
	}
	return took, strings.TrimSpace(string(body))
}

// routedHome is a GET / of actor default/name through the cluster's router,
// and a client of its own (its connections closed when b ends), so the
// benchmark's requests reuse one connection to the router.
func routedHome(b *testing.B, c *cluster, name string) (*http.Request, *http.Client) {
	b.Helper()
	req, err := http.NewRequest(http.MethodGet, c.ingress+"/", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set(router.ActorHeader, "default/"+name)
	client := &http.Client{Transport: &http.Transport{}}
	b.Cleanup(client.CloseIdleConnections)
	return req, client
}

// rawCounter is a workload (the counter, or a big actor's program) in a
// gVisor sandbox that plain runsc checkpoints and restores: no control
// plane, agent, snapshot storage or router.
type rawCounter struct {
	runsc string
	// flags are the gvisor runtime's global runsc flags; a restore must use
	// the ones the checkpointed sandbox ran with.
	flags   []string
	slot    runtime.Slot
	bundle  string
	id      string
	images  string
	console string
	restore int
}

// newRawCounter boots the counter with the gvisor runtime and runsc in a
// slot named name of the cluster's first node network, the index-th beyond
// the agent's workers.
func newRawCounter(b *testing.B, c *cluster, name, runsc string, index int) *rawCounter {
	b.Helper()
	r := bootRaw(b, c, name, runsc, index, counterTemplate(b, name, nil).GetSpec(), "data")
	waitAnswering(b, r.slot.IP)
	return r
}

// bootRaw runs spec's first container with the gvisor runtime and runsc in
// a slot named name of the cluster's first node network, the index-th
// beyond the agent's workers, each volume an empty directory, for plain
// runsc to checkpoint and restore; it is removed when b ends.
func bootRaw(b *testing.B, c *cluster, name, runsc string, index int, spec *torporv1.TemplateSpec, volumes ...string) *rawCounter {
	b.Helper()
	ctx := context.Background()
	n := c.nodes[0]
	slot, err := n.network.Slot(ctx, name, n.workers+index)
	if err != nil {
		b.Fatal(err)
	}
	dir := shortTempDir(b)
	root := filepath.Join(dir, "gvisor")
	rt, err := gvisor.New(gvisor.Config{ConfigureNetwork: netns.Configure, Runsc: runsc, RootDir: root, Logger: testLogger()})
	if err != nil {
		b.Fatal(err)
	}
	rootfs, err := runtimetest.ImagePolicy(b).Unpack(ctx, spec.GetContainers()[0].GetImage(), filepath.Join(dir, "images"))
	if err != nil {
		b.Fatal(err)
	}
	w := runtime.Workload{
		ActorUID: name + "-raw", Space: "default", Actor: name + "-raw", Template: spec,
		Rootfs:  map[string]string{spec.GetContainers()[0].GetName(): rootfs},
		Volumes: map[string]string{},
	}
	for _, v := range volumes {
		w.Volumes[v] = filepath.Join(dir, "volume-"+v)
		if err := os.Mkdir(w.Volumes[v], 0o755); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		// Terminate finds the restored sandboxes by their slot's prefix.
		if err := rt.Terminate(ctx, slot); err != nil {
			b.Errorf("remove the raw sandbox %s: %v", name, err)
		}
		if err := rt.Close(ctx); err != nil {
			b.Errorf("close the runtime of the raw sandbox %s: %v", name, err)
		}
	})
	if err := rt.Run(ctx, slot, w); err != nil {
		b.Fatal(err)
	}
	configs, err := filepath.Glob(filepath.Join(root, "slots", slot.Name, "*", "config.json"))
	if err != nil || len(configs) != 1 {
		b.Fatalf("bundle of the raw sandbox %s: %v %v", name, configs, err)
	}
	r := &rawCounter{
		runsc: runsc,
		flags: []string{"--root=" + filepath.Join(root, "runsc"), "--platform=systrap", "--network=sandbox", "--overlay2=root:memory", "--ignore-cgroups"},
		slot:  slot, bundle: filepath.Dir(configs[0]), id: filepath.Base(filepath.Dir(configs[0])),
		images: filepath.Join(dir, "images-raw"),
	}
	r.console = filepath.Join(r.bundle, "console.log")
	return r
}

// cycle checkpoints the counter and returns how long a plain restore took
// to its first answer.
func (r *rawCounter) cycle(b *testing.B) time.Duration {
	b.StopTimer()
	defer b.StartTimer()
	img := filepath.Join(r.images, fmt.Sprint(r.restore))
	r.run(b, "checkpoint", "--compression=none", "--image-path="+img, r.id)
	r.run(b, "delete", "--force", r.id)
	// The sandbox took the slot's address with it.
	if err := netns.Configure(context.Background(), r.slot); err != nil {
		b.Fatal(err)
	}
	// Named like the runtime's sandboxes of this slot, so its cleanup
	// finds them.
	r.restore++
	r.id = fmt.Sprintf("%s_r%d", r.slot.Name, r.restore)
	t0 := time.Now()
	r.run(b, "restore", "--detach", "--image-path="+img, "--bundle="+r.bundle, r.id)
	waitAnswering(b, r.slot.IP)
	took := time.Since(t0)
	if err := os.RemoveAll(img); err != nil {
		b.Fatal(err)
	}
	return took
}

// run runs one runsc command. Its output goes to the bundle's console
// log: a restored sandbox inherits it, and would hold a pipe open forever.
func (r *rawCounter) run(b *testing.B, args ...string) {
	b.Helper()
	f, err := os.OpenFile(r.console, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(r.runsc, append(slices.Clone(r.flags), args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Run(); err != nil {
		b.Fatalf("runsc %s: %v (output in %s)", strings.Join(args, " "), err, r.console)
	}
}

// waitAnswering polls the counter's /readyz until it answers 200, as often
// as every 2 ms: finer than the node agent's readiness probe, so the
// baseline is close to what runsc alone allows.
func waitAnswering(b *testing.B, ip string) {
	b.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	url := "http://" + net.JoinHostPort(ip, "8080") + "/readyz"
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		if time.Now().After(deadline) {
			b.Fatalf("the raw counter at %s did not answer within 30s: %v", ip, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
