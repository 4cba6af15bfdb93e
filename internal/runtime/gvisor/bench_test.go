package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/latency"
	"github.com/torpor-dev/torpor/internal/netns"
)

// Checkpoint and restore latency of the counter, through the runtime and
// through plain runsc commands on the same bundle and slot, to show what
// the runtime adds. Percentiles need latency.Samples: run with -benchtime=30x.
//
//	go test -run '^$' -bench CheckpointRestore -benchtime=30x ./internal/runtime/gvisor
func BenchmarkCheckpointRestore(b *testing.B) {
	b.Run("runtime", func(b *testing.B) {
		h := newHarness(b)
		ctx := context.Background()
		slot := h.slots[0]
		w := h.workload(b)
		if err := h.rt.Run(ctx, slot, w); err != nil {
			b.Fatal(err)
		}
		waitReady(b, slot.IP)
		var ckpt, restore, ready latency.Samples
		images := b.TempDir()
		b.ResetTimer()
		for i := range b.N {
			img := filepath.Join(images, fmt.Sprint(i))
			t0 := time.Now()
			if err := h.rt.Checkpoint(ctx, slot, img, false); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if err := h.rt.Restore(ctx, slot, w, img); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			waitReady(b, slot.IP)
			ckpt.Add(t1.Sub(t0))
			restore.Add(t2.Sub(t1))
			ready.Add(time.Since(t1))
			os.RemoveAll(img)
		}
		ckpt.Report(b, "checkpoint", 0.50, 0.95)
		restore.Report(b, "restore", 0.50, 0.95)
		ready.Report(b, "restore-ready", 0.50, 0.95)
	})

	b.Run("runsc", func(b *testing.B) {
		h := newHarness(b)
		ctx := context.Background()
		slot := h.slots[0]
		if err := h.rt.Run(ctx, slot, h.workload(b)); err != nil {
			b.Fatal(err)
		}
		waitReady(b, slot.IP)
		ids, err := h.rt.bundles(slot.Name)
		if err != nil || len(ids) != 1 {
			b.Fatalf("bundles = %v, %v", ids, err)
		}
		id, bundle := ids[0], h.rt.bundleDir(slot.Name, ids[0])
		b.Cleanup(func() { h.rt.output(ctx, "delete", "--force", id) })
		var ckpt, restore, ready latency.Samples
		images := b.TempDir()
		b.ResetTimer()
		for i := range b.N {
			img := filepath.Join(images, fmt.Sprint(i))
			t0 := time.Now()
			if _, err := h.rt.output(ctx, "checkpoint", "--compression=none", "--image-path="+img, id); err != nil {
				b.Fatal(err)
			}
			ckpt.Add(time.Since(t0))
			if _, err := h.rt.output(ctx, "delete", "--force", id); err != nil {
				b.Fatal(err)
			}
			if err := netns.Configure(ctx, slot); err != nil {
				b.Fatal(err)
			}
			id = fmt.Sprintf("raw-%d", i)
			t1 := time.Now()
			if err := h.rt.detached(ctx, filepath.Join(bundle, "console.log"), "restore", "--detach", "--image-path="+img, "--bundle="+bundle, id); err != nil {
				b.Fatal(err)
			}
			restore.Add(time.Since(t1))
			waitReady(b, slot.IP)
			ready.Add(time.Since(t1))
			os.RemoveAll(img)
		}
		ckpt.Report(b, "checkpoint", 0.50, 0.95)
		restore.Report(b, "restore", 0.50, 0.95)
		ready.Report(b, "restore-ready", 0.50, 0.95)
	})
}
