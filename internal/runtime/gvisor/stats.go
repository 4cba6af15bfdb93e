package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/torpor-dev/torpor/internal/runtime"
)

// Stats implements runtime.Runtime. Memory and CPU are best effort (0 if
// runsc cannot tell).
func (r *Runtime) Stats(ctx context.Context, slot runtime.Slot) (runtime.Stats, error) {
	if err := checkSlotName(slot.Name); err != nil {
		return runtime.Stats{}, fmt.Errorf("stats: %w", err)
	}
	defer r.lock(slot.Name)()
	ids, warm, err := r.sandboxes(slot.Name)
	if err != nil {
		return runtime.Stats{}, err
	}
	if len(ids) == 0 {
		if len(warm) == 0 {
			return runtime.Stats{}, nil
		}
		// A warm sandbox runsc no longer holds as created (it died, or
		// began running and the runtime stopped before recording it) is
		// no warm sandbox: it is reported as one that is not running,
		// which a node removes.
		if st, err := r.state(ctx, warm[0]); err != nil || st.Status != "created" {
			return runtime.Stats{Running: err == nil && st.Status == "running"}, nil
		}
		return runtime.Stats{Warm: true}, nil
	}
	id := ids[0]
	st, err := r.state(ctx, id)
	if err != nil {
		// runsc no longer holds the sandbox whole (it exited after saving
		// itself, or its runsc command died with its agent half way):
		// it runs no workload, and a node removes it. An agent that
		// refused to start over it would lose every workload it hosts.
		r.log.Warn("sandbox state unreadable; taking it for stopped", "slot", slot.Name, "sandbox", id, "err", err)
		return runtime.Stats{}, nil
	}
	stats := runtime.Stats{Running: st.Status == "running"}
	// runsc state has no start time; the spec is written right before
	// runsc starts the sandbox.
	if fi, err := os.Stat(filepath.Join(r.bundleDir(slot.Name, id), "config.json")); err == nil {
		stats.Started = fi.ModTime()
	}
	if !stats.Running {
		return stats, nil
	}
	// Memory from the sentry's accounting; its CPU figure is the
	// cgroup's, the host's without one (cpu.go).
	if out, err := r.output(ctx, "events", "--stats", id); err == nil {
		var ev events
		if json.Unmarshal(out, &ev) == nil {
			stats.MemoryBytes = ev.Data.Memory.Usage.Usage
		}
	}
	if st.Pid > 0 {
		if cpu, err := treeCPU("/proc", st.Pid); err == nil {
			stats.CPU = cpu
		}
	}
	return stats, nil
}
