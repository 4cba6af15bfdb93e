package e2e

import (
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/latency"
	"github.com/torpor-dev/torpor/internal/router"
)

// burstActors is how many new actors BenchmarkBurst activates at once.
const burstActors = 40

// BenchmarkBurst: burstActors new actors of one template (never resumed:
// each starts from the golden snapshot) activated at once, a request each
// through the router in parallel, on one node with a worker for each
// (issue 30, "bursts"). Baseline, in the same iteration: as many new
// actors activated one after another. Reports the burst's wall time, its
// activations' p50 and p95, and the burst's time against the sequential
// one's; and each node step's p50 over the burst, from the actors'
// events, to show what serializes.
//
//	go test -run '^$' -bench Burst -benchtime=1x ./e2e
func BenchmarkBurst(b *testing.B) {
	c := newCluster(b, clusterOptions{backend: "sqlite", workersPerNode: burstActors})
	c.applyTemplate(counterTemplate(b, "counter", nil))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: burstActors}}
	b.Cleanup(client.CloseIdleConnections)
	activate := func(name string) time.Duration {
		req, err := http.NewRequest(http.MethodGet, c.ingress+"/", nil)
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set(router.ActorHeader, "default/"+name)
		took, body := fetch(b, client, req)
		if body != "count=1 lines=1" {
			b.Errorf("first answer of %s: %q", name, body)
		}
		return took
	}
	round := 0
	for b.Loop() {
		round++
		burst := make([]string, burstActors)
		for i := range burst {
			burst[i] = fmt.Sprintf("b%d-%d", round, i)
			c.createActor(burst[i], "counter")
		}
		var mu sync.Mutex
		var each latency.Samples
		var wg sync.WaitGroup
		start := time.Now()
		for _, name := range burst {
			wg.Go(func() {
				took := activate(name)
				mu.Lock()
				each.Add(took)
				mu.Unlock()
			})
		}
		wg.Wait()
		wall := time.Since(start)
		steps := map[string]*latency.Samples{}
		for _, name := range burst {
			for step, d := range resumeSteps(c, name) {
				if steps[step] == nil {
					steps[step] = &latency.Samples{}
				}
				steps[step].Add(d)
			}
		}
		// Free the workers, then the baseline: the same number, one at a
		// time.
		for _, name := range burst {
			c.suspend(name)
		}
		start = time.Now()
		for i := range burstActors {
			name := fmt.Sprintf("s%d-%d", round, i)
			c.createActor(name, "counter")
			activate(name)
		}
		sequential := time.Since(start)
		b.ReportMetric(wall.Seconds(), "burst-s")
		b.ReportMetric(sequential.Seconds(), "sequential-s")
		b.ReportMetric(wall.Seconds()/sequential.Seconds(), "burst/sequential")
		each.Report(b, "activation", 0.50, 0.95)
		for _, step := range slices.Sorted(maps.Keys(steps)) {
			steps[step].Report(b, "burst-step-"+step, 0.50)
		}
	}
}

// resumeStep matches one node step in a resume's event ("start 83.5ms").
var resumeStep = regexp.MustCompile(`(claim|node|unpack|fetch|volumes|identity|start|ready) ([0-9.]+)ms`)

// resumeSteps are the steps the resume event of actor name gives.
func resumeSteps(c *cluster, name string) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, e := range c.events(name) {
		for _, m := range resumeStep.FindAllStringSubmatch(e.GetReason(), -1) {
			ms, err := strconv.ParseFloat(m[2], 64)
			if err == nil {
				out[m[1]] = time.Duration(ms * float64(time.Millisecond))
			}
		}
	}
	return out
}
