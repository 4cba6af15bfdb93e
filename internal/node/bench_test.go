package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/latency"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

// BenchmarkCheckpointRestore moves the counter back and forth between two
// workers through the node agent API (FULL checkpoint to storage, restore
// to readiness on the other worker) and, as the baseline, through plain
// runsc checkpoint and restore on the same bundle.
func BenchmarkCheckpointRestore(b *testing.B) {
	for _, bc := range []struct {
		name  string
		cache int64
		warm  bool
	}{
		// The checkpoint leaves its tree in the node's cache.
		{"agent", 256 << 20, false},
		// Every restore downloads and verifies, as on another node.
		{"agent-uncached", 1, false},
		// The worker restored into is warm for the actor: it was
		// emptied by the previous move, and the benchmark waits
		// (untimed) for its warm-up.
		{"agent-warm", 256 << 20, true},
	} {
		b.Run(bc.name, func(b *testing.B) { benchmarkAgent(b, bc.cache, bc.warm) })
	}
	b.Run("runsc", benchmarkRunsc)
}

func benchmarkAgent(b *testing.B, cacheBytes int64, warm bool) {
	n := newGVisorNode(b, cacheBytes, func(c *Config) { c.NoWarm = !warm })
	ctx := context.Background()
	actor := workload("bench-actor", "bench", counterTemplate(runtimetest.CounterImage(b)))
	resp, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("bench-actor", "run", n.worker(0)), Workload: actor}))
	if err != nil {
		b.Fatal(err)
	}
	get(b, resp.Msg.GetWorkerIp())
	var ckpt, restore latency.Samples
	from, previous := 0, ""
	b.ResetTimer()
	for i := range b.N {
		location := fmt.Sprintf("bench/bench-actor/s%d", i)
		if warm && i > 0 {
			b.StopTimer()
			n.waitWarm(b, 1-from)
			b.StartTimer()
		}
		t0 := time.Now()
		c, err := n.client.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{
			Op: op("bench-actor", fmt.Sprint("checkpoint-", i), n.worker(from)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
			Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: location, Warm: warm,
		}))
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := n.restore(b, actor, fmt.Sprint("restore-", i), 1-from, torporv1.RestoreScope_RESTORE_SCOPE_FULL,
			&torporv1.SnapshotSource{Location: location, ManifestDigest: c.Msg.GetManifestDigest()}, nil); err != nil {
			b.Fatal(err)
		}
		// The first move of the warm variant finds no worker warm yet.
		if !warm || i > 0 {
			ckpt.Add(t1.Sub(t0))
			restore.Add(time.Since(t1))
		}
		from = 1 - from
		b.StopTimer()
		if previous != "" {
			if err := snapshot.DeleteSnapshot(ctx, n.objects, previous); err != nil {
				b.Fatal(err)
			}
		}
		previous = location
		b.StartTimer()
	}
	b.StopTimer()
	// The memory survived every move: one request before, one now.
	if got := get(b, n.ip(b, from)); got != "count=2 lines=2" {
		b.Fatalf("after %d moves: %q, want count=2 lines=2", b.N, got)
	}
	ckpt.Report(b, "checkpoint", 0.50, 0.95)
	restore.Report(b, "restore-ready", 0.50, 0.95)
}

// waitWarm waits until worker i is warm.
func (n *gvisorNode) waitWarm(b *testing.B, i int) {
	b.Helper()
	waitFor(b, fmt.Sprintf("worker %d to be warm", i), func() bool {
		st, err := n.runtime.Stats(context.Background(), runtime.Slot{Name: n.worker(i)})
		return err == nil && st.Warm
	})
}

// benchmarkRunsc checkpoints and restores the sandbox the agent's runtime
// made for the counter with runsc itself: no snapshot storage, volumes or
// records, the same bundle restored in the same slot.
func benchmarkRunsc(b *testing.B) {
	n := newGVisorNode(b, 1)
	ctx := context.Background()
	actor := workload("bench-actor", "bench", counterTemplate(runtimetest.CounterImage(b)))
	resp, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("bench-actor", "run", n.worker(0)), Workload: actor}))
	if err != nil {
		b.Fatal(err)
	}
	ip := resp.Msg.GetWorkerIp()
	get(b, ip)
	slot, err := n.network.Slot(ctx, n.worker(0), 0)
	if err != nil {
		b.Fatal(err)
	}
	bundles, err := filepath.Glob(filepath.Join(n.stateDir, "gvisor", "slots", slot.Name, "*", "config.json"))
	if err != nil || len(bundles) != 1 {
		b.Fatalf("bundle of %s: %v %v", slot.Name, bundles, err)
	}
	bundle := filepath.Dir(bundles[0])
	id := filepath.Base(bundle)
	flags := sandboxFlags(b, id)
	console, err := os.Create(filepath.Join(b.TempDir(), "console.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer console.Close()
	runsc := func(args ...string) {
		b.Helper()
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, runtimetest.Runsc(b), append(slices.Clone(flags), args...)...)
		// A restored sandbox inherits these: a file, never a pipe that
		// would stay open as long as the sandbox.
		cmd.Stdout, cmd.Stderr = console, console
		if err := cmd.Run(); err != nil {
			b.Fatalf("runsc %s: %v (output in %s)", strings.Join(args, " "), err, console.Name())
		}
	}
	images := b.TempDir()
	var ckpt, restore latency.Samples
	b.ResetTimer()
	for i := range b.N {
		img := filepath.Join(images, fmt.Sprint(i))
		t0 := time.Now()
		runsc("checkpoint", "--compression=none", "--image-path="+img, id)
		ckpt.Add(time.Since(t0))
		b.StopTimer()
		runsc("delete", "--force", id)
		// runsc took the slot's address with the sandbox.
		if err := netns.Configure(ctx, slot); err != nil {
			b.Fatal(err)
		}
		// Named like the runtime's ids, so its cleanup finds them.
		id = fmt.Sprintf("%s_raw%d", slot.Name, i)
		b.StartTimer()
		t1 := time.Now()
		runsc("restore", "--detach", "--image-path="+img, "--bundle="+bundle, id)
		waitServing(b, ip)
		restore.Add(time.Since(t1))
		b.StopTimer()
		os.RemoveAll(img)
		b.StartTimer()
	}
	b.StopTimer()
	if got := get(b, ip); got != "count=2 lines=2" {
		b.Fatalf("after %d restores: %q, want count=2 lines=2", b.N, got)
	}
	runsc("delete", "--force", id)
	if err := n.runtime.Terminate(ctx, runtime.Slot{Name: slot.Name}); err != nil {
		b.Fatal(err)
	}
	ckpt.Report(b, "checkpoint", 0.50, 0.95)
	restore.Report(b, "restore-ready", 0.50, 0.95)
}

// sandboxFlags returns the global runsc flags the runtime started sandbox
// id with, read from its sandbox process, so the baseline runs runsc
// exactly as the runtime does.
func sandboxFlags(b *testing.B, id string) []string {
	b.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) < 2 || args[0] != "runsc-sandbox" || args[len(args)-1] != id {
			continue
		}
		var flags []string
		for _, a := range args[1:] {
			if a == "boot" {
				return flags
			}
			flags = append(flags, a)
		}
	}
	b.Fatalf("no sandbox process for %s", id)
	return nil
}

// waitServing polls the counter's readiness endpoint as the agent's probe
// does.
func waitServing(b *testing.B, ip string) {
	b.Helper()
	pr := &prober{client: newProbeClient()}
	url := "http://" + ip + ":8080/readyz"
	r := readiness{timeout: 30 * time.Second, period: probeInterval, attemptTimeout: probeAttemptTimeout, attempt: pr.httpAttempt(url)}
	if err := poll(context.Background(), r); err != nil {
		b.Fatal(err)
	}
}
