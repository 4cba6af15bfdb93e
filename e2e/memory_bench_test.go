package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// idleMemoryActors is how many counters BenchmarkIdleMemory keeps running.
const idleMemoryActors = 20

// BenchmarkIdleMemory: what an idle running actor costs the host's
// memory (issue 30, "memory per sandbox"). idleMemoryActors counters are
// resumed (restored from the template's golden snapshot, each on a worker
// of one node), then left idle for a minute; it reports, per actor, the
// drop in the host's MemAvailable and the proportional set size (PSS) of
// the node's runsc processes (sandboxes and gofers), after 5 s and after
// the minute, and, as the baselines, the PSS of one counter booted by
// plain runsc with the runtime's flags, and of the same restored by it,
// each after a minute. Run it on an
// otherwise idle machine: MemAvailable is the host's.
//
//	go test -run '^$' -bench IdleMemory -benchtime=1x ./e2e
func BenchmarkIdleMemory(b *testing.B) {
	c := newCluster(b, clusterOptions{backend: "sqlite", workersPerNode: idleMemoryActors})
	c.applyTemplate(counterTemplate(b, "counter", nil))
	n := c.nodes[0]
	for b.Loop() {
		// The golden build's warm sandbox, if any, is counted in before.
		time.Sleep(2 * time.Second)
		before, beforePSS := memAvailable(b), processesPSS(b, filepath.Join(n.state, "gvisor"))
		for i := range idleMemoryActors {
			name := fmt.Sprintf("m%d", i)
			c.createActor(name, "counter")
			c.mustResume(name)
		}
		// Idle: whatever the restores allocated and freed settles, and
		// the sentries' Go runtimes return freed heap to the host over
		// minutes (their scavengers): measured after 5 s and after 60 s.
		time.Sleep(5 * time.Second)
		b.ReportMetric(float64(processesPSS(b, filepath.Join(n.state, "gvisor"))-beforePSS)/idleMemoryActors/1e6, "pss-5s-MB/actor")
		time.Sleep(55 * time.Second)
		after, afterPSS := memAvailable(b), processesPSS(b, filepath.Join(n.state, "gvisor"))
		b.ReportMetric(float64(before-after)/idleMemoryActors/1e6, "memavail-MB/actor")
		b.ReportMetric(float64(afterPSS-beforePSS)/idleMemoryActors/1e6, "pss-MB/actor")

		raw := newRawCounter(b, c, "rawmem", runtimetest.Runsc(b), 0)
		time.Sleep(60 * time.Second)
		rawPSS := processesPSS(b, filepath.Dir(raw.flags[0][len("--root="):]))
		b.ReportMetric(float64(rawPSS)/1e6, "runsc-pss-MB")
		b.ReportMetric(float64(afterPSS-beforePSS)/idleMemoryActors/float64(rawPSS), "pss/runsc")
		// The same sandbox checkpointed and restored by plain runsc: what
		// a restore itself adds.
		raw.cycle(b)
		time.Sleep(60 * time.Second)
		b.ReportMetric(float64(processesPSS(b, filepath.Dir(raw.flags[0][len("--root="):])))/1e6, "runsc-restored-pss-MB")
	}
}

// memAvailable is the host's MemAvailable, in bytes.
func memAvailable(tb testing.TB) int64 {
	tb.Helper()
	return meminfoField(tb, "/proc/meminfo", "MemAvailable:")
}

// processesPSS sums the PSS of the processes whose command line names
// dir, in bytes.
func processesPSS(tb testing.TB, dir string) int64 {
	tb.Helper()
	var sum int64
	for _, p := range processesMentioning(tb, dir) {
		pid, _, _ := strings.Cut(p, ":")
		if _, err := os.Stat(filepath.Join("/proc", pid, "smaps_rollup")); err != nil {
			continue // gone meanwhile
		}
		sum += meminfoField(tb, filepath.Join("/proc", pid, "smaps_rollup"), "Pss:")
	}
	return sum
}

// meminfoField reads a "Name: N kB" line of a /proc file, in bytes; 0 if
// the file went away.
func meminfoField(tb testing.TB, path, name string) int64 {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == name {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				tb.Fatalf("%s: %s %q", path, name, f[1])
			}
			return kb << 10
		}
	}
	tb.Fatalf("%s: no %s line", path, name)
	return 0
}
