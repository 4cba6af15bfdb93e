package workflow

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/latency"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/validate"
)

// The fleet the control-plane benchmark drives: many actors sharing fewer
// workers on two nodes, so every resume has to find and claim a free worker.
const (
	benchActors         = 64
	benchNodes          = 2
	benchWorkersPerNode = 8
)

// BenchmarkResumeSuspend measures what the control plane itself costs per
// resume and suspend: the workflow engine over a real store, with node
// agents that do no work, so every millisecond is store round trips and
// engine code. Each iteration resumes one suspended actor and suspends it
// again. "goroutines=1" gives the latency of an uncontended step;
// "goroutines=8" drives disjoint actors at once and gives the throughput
// (cycles/s) and the latency under contention for workers.
//
//	go test -run '^$' -bench ResumeSuspend -benchtime=3s ./internal/workflow
func BenchmarkResumeSuspend(b *testing.B) {
	for _, backend := range storetest.Backends {
		for _, goroutines := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", backend, goroutines), func(b *testing.B) {
				url := storetest.URL(b, backend)
				var trips *atomic.Int64
				if backend == "postgres" {
					url, trips = storetest.RoundTrips(b, url)
				}
				f := newBenchFleet(b, url, 0)
				f.trips = trips
				f.run(b, goroutines)
			})
		}
	}
}

// BenchmarkBackends sets PostgreSQL against SQLite on the same work: each
// iteration does backendRound cycles from 8 goroutines on a fleet over
// SQLite, then as many on one over PostgreSQL (connected directly, with
// no round-trip counter in between), and it reports both rates and their
// ratio over the whole run.
//
//	go test -run '^$' -bench Backends -benchtime=10x ./internal/workflow
func BenchmarkBackends(b *testing.B) {
	const goroutines, backendRound = 8, 300
	fleets := make([]*benchFleet, len(storetest.Backends))
	elapsed := make([]time.Duration, len(storetest.Backends))
	for i, backend := range storetest.Backends {
		fleets[i] = newBenchFleet(b, storetest.URL(b, backend), 0)
	}
	rounds := 0
	for b.Loop() {
		for i, f := range fleets {
			elapsed[i] += f.drive(b, goroutines, backendRound, nil, nil)
		}
		rounds++
	}
	rate := make(map[string]float64, len(fleets))
	for i, backend := range storetest.Backends {
		rate[backend] = float64(rounds*backendRound) / elapsed[i].Seconds()
		b.ReportMetric(rate[backend], backend+"-cycles/s")
	}
	b.ReportMetric(rate["postgres"]/rate["sqlite"], "postgres/sqlite")
}

// BenchmarkResumeSuspendAtScale is BenchmarkResumeSuspend (one goroutine,
// SQLite) with many more actors stored, all suspended: the design's target
// is that a million stored actors make no operation slower and take no
// more control-plane memory. Besides latency it reports the Go heap in use
// and the process's resident memory (which includes SQLite's page cache)
// after the run.
//
//	go test -run '^$' -bench ResumeSuspendAtScale -benchtime=2000x -timeout 30m ./internal/workflow
func BenchmarkResumeSuspendAtScale(b *testing.B) {
	for _, stored := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("stored=%d", stored), func(b *testing.B) {
			f := newBenchFleet(b, storetest.URL(b, "sqlite"), stored)
			f.run(b, 1)
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			b.ReportMetric(float64(m.HeapInuse)/(1<<20), "heap-MiB")
			b.ReportMetric(residentMiB(b), "rss-MiB")
		})
	}
}

// residentMiB is the process's resident set (VmRSS) in MiB.
func residentMiB(tb testing.TB) float64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				tb.Fatal(err)
			}
			return float64(kb) / 1024
		}
	}
	tb.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// benchFleet is an engine over a real store whose nodes are served by
// fake agents.
type benchFleet struct {
	ctx    context.Context
	store  store.Store
	agents fakeAgents
	engine *Engine
	actors []string
	// claims counts resume claim attempts: more than one per resume means
	// concurrent resumes raced for the same worker and retried.
	claims atomic.Int64
	// trips, when set, counts the store's round trips to its database.
	trips *atomic.Int64
}

// newBenchFleet seeds the fleet, plus idle suspended actors that are
// stored but never driven.
func newBenchFleet(tb testing.TB, storeURL string, idle int) *benchFleet {
	tb.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, storeURL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	f := &benchFleet{ctx: ctx, store: st, agents: fakeAgents{}}
	f.engine = New(st, f.agents, &fakeObjects{}, Options{HeartbeatTimeout: time.Hour}, slog.New(slog.DiscardHandler))
	f.engine.SetHooks(Hooks{BeforeResumeClaim: func(*torporv1.Actor) { f.claims.Add(1) }})
	err = st.InTx(ctx, func(tx store.Tx) error {
		for n := range benchNodes {
			node := fmt.Sprintf("node-%d", n)
			f.agents[node] = newFakeAgent(node)
			if _, err := tx.Nodes().Create(ctx, &torporv1.Node{Metadata: &torporv1.ObjectMeta{Name: node}, Address: "fake", HeartbeatTime: timestamppb.Now()}); err != nil {
				return err
			}
			for w := range benchWorkersPerNode {
				if _, err := tx.Workers().Create(ctx, &torporv1.Worker{
					Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: fmt.Sprintf("%s-w%d", node, w)},
					Spec:     &torporv1.WorkerSpec{Node: node, Ip: fmt.Sprintf("10.0.%d.%d", n, w+2), Pool: "default", SandboxClass: "gvisor"},
					Status:   &torporv1.WorkerStatus{},
				}); err != nil {
					return err
				}
			}
		}
		if _, _, err := ApplyTemplate(ctx, tx, &torporv1.ObjectMeta{Space: "default", Name: "counter"}, &torporv1.TemplateSpec{
			SandboxClass: "gvisor",
			Containers:   []*torporv1.Container{{Name: "main", Image: "img"}},
			SnapshotPolicy: &torporv1.SnapshotPolicy{
				OnCommit: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Keep: 2,
				OnResume: &torporv1.OnResume{FromData: torporv1.FromData_FROM_DATA_COLD_BOOT},
			},
		}); err != nil {
			return err
		}
		for i := range benchActors {
			name := fmt.Sprintf("a%d", i)
			if _, err := tx.Actors().Create(ctx, &torporv1.Actor{
				Metadata: &torporv1.ObjectMeta{Space: "default", Name: name},
				Spec:     &torporv1.ActorSpec{Template: "counter", TemplateRevision: 1},
				Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED},
			}); err != nil {
				return err
			}
			f.actors = append(f.actors, name)
		}
		for i := range idle {
			if _, err := tx.Actors().Create(ctx, &torporv1.Actor{
				Metadata: &torporv1.ObjectMeta{Space: "default", Name: fmt.Sprintf("idle-%d", i)},
				Spec:     &torporv1.ActorSpec{Template: "counter", TemplateRevision: 1},
				Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED},
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("seed the benchmark fleet: %v", err)
	}
	// One cycle per actor first, so the measured resumes restore a
	// snapshot (as in steady state) instead of booting.
	for _, name := range f.actors {
		f.cycle(tb, name, nil, nil)
	}
	return f
}

// cycle resumes and suspends one actor, adding each step's latency to
// resumes and suspends when they are given.
func (f *benchFleet) cycle(tb testing.TB, name string, resumes, suspends *latency.Samples) {
	t0 := time.Now()
	a, err := f.engine.Resume(f.ctx, "default", name, ResumeOptions{})
	if err != nil {
		tb.Errorf("resume %s: %v", name, err)
		return
	}
	if a.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING {
		tb.Errorf("resume %s: %v, want RUNNING", name, a.GetStatus().GetState())
		return
	}
	t1 := time.Now()
	if a, err = f.engine.Suspend(f.ctx, "default", name); err != nil {
		tb.Errorf("suspend %s: %v", name, err)
		return
	}
	if a.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		tb.Errorf("suspend %s: %v, want SUSPENDED", name, a.GetStatus().GetState())
		return
	}
	if resumes != nil {
		resumes.Add(t1.Sub(t0))
		suspends.Add(time.Since(t1))
	}
}

// run does b.N cycles from goroutines goroutines, each on its own actors so
// no step ever waits for another step of the same actor.
func (f *benchFleet) run(b *testing.B, goroutines int) {
	restoresBefore := f.calls("Restore")
	f.claims.Store(0)
	var tripsBefore int64
	if f.trips != nil {
		tripsBefore = f.trips.Load()
	}
	resumes := make([]latency.Samples, goroutines)
	suspends := make([]latency.Samples, goroutines)
	b.ResetTimer()
	elapsed := f.drive(b, goroutines, b.N, resumes, suspends)
	b.StopTimer()
	if b.Failed() {
		return
	}
	if got := f.calls("Restore") - restoresBefore; got != b.N {
		b.Fatalf("%d cycles made %d restores", b.N, got)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
	b.ReportMetric(float64(f.claims.Load())/float64(b.N), "claims/resume")
	if f.trips != nil {
		b.ReportMetric(float64(f.trips.Load()-tripsBefore)/float64(b.N), "round-trips/cycle")
	}
	slices.Concat(resumes...).Report(b, "resume", 0.50, 0.99)
	slices.Concat(suspends...).Report(b, "suspend", 0.50, 0.99)
}

// drive does n cycles from goroutines goroutines, each on its own actors
// so no step ever waits for another step of the same actor, adding the
// g-th goroutine's step latencies to resumes[g] and suspends[g] when
// given, and checks the fleet is back at rest after them (every worker
// free). It returns how long the cycles took.
func (f *benchFleet) drive(b *testing.B, goroutines, n int, resumes, suspends []latency.Samples) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for g := range goroutines {
		wg.Go(func() {
			var resumed, suspended *latency.Samples
			if resumes != nil {
				resumed, suspended = &resumes[g], &suspends[g]
			}
			for k := 0; ; k++ {
				if next.Add(1) > int64(n) || b.Failed() {
					return
				}
				f.cycle(b, f.actors[(g+k*goroutines)%len(f.actors)], resumed, suspended)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if b.Failed() {
		return elapsed
	}
	free, err := store.ListAll(f.ctx, f.store.Workers(), store.ListOptions{Filter: store.Filter{"actor": ""}})
	if err != nil {
		b.Fatal(err)
	}
	if len(free) != benchNodes*benchWorkersPerNode {
		b.Fatalf("%d of %d workers are free after the run", len(free), benchNodes*benchWorkersPerNode)
	}
	return elapsed
}

func (f *benchFleet) calls(method string) int {
	n := 0
	for _, a := range f.agents {
		n += a.callCount(method)
	}
	return n
}
