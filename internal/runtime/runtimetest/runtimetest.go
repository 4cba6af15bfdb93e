// Package runtimetest holds the behaviour every runtime.Runtime must share,
// as a test suite run against each implementation (so the in-process fake
// cannot drift from runsc), and helpers for tests on the real runtime.
package runtimetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime"
)

// Env is a runtime under test with two slots it may use freely.
type Env struct {
	Runtime runtime.Runtime
	Slots   [2]runtime.Slot
	// Workload returns a startable workload with one durable volume
	// mounted at /data, its host directory fresh and empty.
	Workload func(t *testing.T) runtime.Workload
	// Pod returns a startable workload of two containers, "main" and
	// "side", both mounting one durable volume, its host directory fresh
	// and empty.
	Pod func(t *testing.T) runtime.Workload
	// True is a command that exits 0 in every container of both.
	True []string
}

// Conformance runs the shared behaviour tests against env.
func Conformance(t *testing.T, env Env) {
	rt, a, b := env.Runtime, env.Slots[0], env.Slots[1]
	ctx := context.Background()
	terminate := func(t *testing.T) {
		t.Helper()
		for _, s := range env.Slots {
			if err := rt.Terminate(ctx, s); err != nil {
				t.Fatalf("Terminate(%s): %v", s.Name, err)
			}
		}
	}
	assertSandboxes := func(t *testing.T, want ...string) {
		t.Helper()
		got, err := rt.Sandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Sandboxes() = %v, want %v", got, want)
		}
	}
	assertRunning := func(t *testing.T, s runtime.Slot, want bool) {
		t.Helper()
		st, err := rt.Stats(ctx, s)
		if err != nil {
			t.Fatalf("Stats(%s): %v", s.Name, err)
		}
		if st.Running != want {
			t.Fatalf("Stats(%s).Running = %v, want %v", s.Name, st.Running, want)
		}
	}

	t.Run("EmptySlot", func(t *testing.T) {
		terminate(t)
		assertSandboxes(t)
		assertRunning(t, a, false)
		for range 2 {
			if err := rt.Terminate(ctx, a); err != nil {
				t.Fatalf("Terminate on an empty slot: %v", err)
			}
		}
		err := rt.Checkpoint(ctx, a, t.TempDir(), false)
		if !errors.Is(err, runtime.ErrNotRunning) {
			t.Fatalf("Checkpoint on an empty slot = %v, want ErrNotRunning", err)
		}
	})

	t.Run("BusySlot", func(t *testing.T) {
		defer terminate(t)
		w := env.Workload(t)
		if err := rt.Run(ctx, a, w); err != nil {
			t.Fatal(err)
		}
		assertRunning(t, a, true)
		assertSandboxes(t, a.Name)
		if err := rt.Run(ctx, a, w); !errors.Is(err, runtime.ErrBusy) {
			t.Fatalf("Run on a busy slot = %v, want ErrBusy", err)
		}
		img := t.TempDir()
		if err := rt.Checkpoint(ctx, a, img, true); err != nil {
			t.Fatal(err)
		}
		if err := rt.Restore(ctx, a, w, img); !errors.Is(err, runtime.ErrBusy) {
			t.Fatalf("Restore on a busy slot = %v, want ErrBusy", err)
		}
		assertRunning(t, a, true)
		if err := rt.Terminate(ctx, a); err != nil {
			t.Fatal(err)
		}
		assertRunning(t, a, false)
		assertSandboxes(t)
		if err := rt.Run(ctx, a, w); err != nil {
			t.Fatalf("Run after Terminate: %v", err)
		}
	})

	t.Run("MissingImage", func(t *testing.T) {
		defer terminate(t)
		w := env.Workload(t)
		for _, dir := range []string{t.TempDir(), filepath.Join(t.TempDir(), "absent"), ""} {
			if err := rt.Restore(ctx, a, w, dir); !errors.Is(err, runtime.ErrNoImage) {
				t.Errorf("Restore from %q = %v, want ErrNoImage", dir, err)
			}
		}
		assertSandboxes(t)
	})

	t.Run("CheckpointMovesTheWorkload", func(t *testing.T) {
		defer terminate(t)
		w := env.Workload(t)
		if err := rt.Run(ctx, a, w); err != nil {
			t.Fatal(err)
		}
		img := filepath.Join(t.TempDir(), "image") // made by Checkpoint
		if err := rt.Checkpoint(ctx, a, img, false); err != nil {
			t.Fatal(err)
		}
		assertRunning(t, a, false)
		assertSandboxes(t)
		if err := rt.Restore(ctx, b, w, img); err != nil {
			t.Fatal(err)
		}
		assertRunning(t, b, true)
		assertSandboxes(t, b.Name)
		// The image stays usable: a second restore elsewhere works too.
		if err := rt.Restore(ctx, a, w, img); err != nil {
			t.Fatalf("second restore of one image: %v", err)
		}
		assertSandboxes(t, a.Name, b.Name)
	})

	t.Run("RejectsBadWorkloads", func(t *testing.T) {
		defer terminate(t)
		good := env.Workload(t)
		sameName := withTemplate(good, func(tmpl *torporv1.TemplateSpec) {
			tmpl.Containers = append(tmpl.Containers, proto.Clone(tmpl.Containers[0]).(*torporv1.Container))
		})
		noVolumeDir := good
		noVolumeDir.Volumes = map[string]string{}
		for name, vol := range good.Volumes {
			noVolumeDir.Volumes[name] = filepath.Join(vol, "absent")
		}
		noRootfs := good
		noRootfs.Rootfs = map[string]string{}
		undeclared := withTemplate(good, func(tmpl *torporv1.TemplateSpec) { tmpl.Volumes = nil })
		for name, w := range map[string]runtime.Workload{
			"two containers of one name": sameName, "missing volume dir": noVolumeDir,
			"no rootfs": noRootfs, "undeclared volume": undeclared,
		} {
			if err := rt.Run(ctx, a, w); err == nil {
				t.Errorf("Run with %s succeeded", name)
				terminate(t)
			}
		}
		assertSandboxes(t)
	})

	t.Run("Exec", func(t *testing.T) {
		defer terminate(t)
		w := env.Workload(t)
		name := w.Template.GetContainers()[0].GetName()
		if err := rt.Exec(ctx, a, name, env.True); !errors.Is(err, runtime.ErrNotRunning) {
			t.Fatalf("Exec in an empty slot = %v, want ErrNotRunning", err)
		}
		if err := rt.Run(ctx, a, w); err != nil {
			t.Fatal(err)
		}
		if err := rt.Exec(ctx, a, name, env.True); err != nil {
			t.Fatalf("Exec %q in container %s: %v", env.True, name, err)
		}
		if err := rt.Exec(ctx, a, "absent", env.True); err == nil || !strings.Contains(err.Error(), `"absent"`) {
			t.Fatalf("Exec in a container the workload does not have = %v, want an error naming it", err)
		}
	})

	t.Run("SeveralContainers", func(t *testing.T) {
		defer terminate(t)
		w := env.Pod(t)
		if err := rt.Run(ctx, a, w); err != nil {
			t.Fatal(err)
		}
		assertRunning(t, a, true)
		assertSandboxes(t, a.Name)
		for _, name := range []string{"main", "side"} {
			if err := rt.Exec(ctx, a, name, env.True); err != nil {
				t.Fatalf("Exec in container %s: %v", name, err)
			}
		}
		img := t.TempDir()
		if err := rt.Checkpoint(ctx, a, img, false); err != nil {
			t.Fatal(err)
		}
		assertSandboxes(t)
		// An image holds every container: a workload without one of them
		// does not restore from it, and leaves the slot free.
		mainOnly := withTemplate(w, func(tmpl *torporv1.TemplateSpec) { tmpl.Containers = tmpl.Containers[:1] })
		if err := rt.Restore(ctx, b, mainOnly, img); err == nil {
			t.Fatal("restoring a two-container image as one container succeeded")
		}
		assertSandboxes(t)
		if err := rt.Restore(ctx, b, w, img); err != nil {
			t.Fatal(err)
		}
		assertRunning(t, b, true)
		if err := rt.Exec(ctx, b, "side", env.True); err != nil {
			t.Fatalf("Exec in the restored container side: %v", err)
		}
		// A warm sandbox takes the containers too.
		img = t.TempDir()
		if err := rt.Checkpoint(ctx, b, img, false); err != nil {
			t.Fatal(err)
		}
		if err := rt.Warm(ctx, a, w); err != nil {
			t.Fatal(err)
		}
		if err := rt.Restore(ctx, a, w, img); err != nil {
			t.Fatalf("Restore of two containers in a warm slot: %v", err)
		}
		assertRunning(t, a, true)
		assertWarm(t, rt, a, false)
		assertSandboxes(t, a.Name)
		if err := rt.Exec(ctx, a, "side", env.True); err != nil {
			t.Fatalf("Exec in container side restored in a warm slot: %v", err)
		}
	})

	t.Run("FailedRestoreLeavesTheSlotFree", func(t *testing.T) {
		defer terminate(t)
		w := env.Workload(t)
		if err := rt.Run(ctx, a, w); err != nil {
			t.Fatal(err)
		}
		img := t.TempDir()
		if err := rt.Checkpoint(ctx, a, img, false); err != nil {
			t.Fatal(err)
		}
		// An image only restores the workload it was taken from.
		other := withTemplate(w, func(tmpl *torporv1.TemplateSpec) {
			tmpl.Containers[0].Args = append(tmpl.Containers[0].Args, "--other")
		})
		if err := rt.Restore(ctx, b, other, img); err == nil {
			t.Fatal("restoring another workload's image succeeded")
		}
		assertSandboxes(t)
		if err := rt.Restore(ctx, b, w, img); err != nil {
			t.Fatalf("Restore after a failed one: %v", err)
		}
		assertRunning(t, b, true)
	})

	t.Run("WarmSlot", func(t *testing.T) {
		defer terminate(t)
		w := env.Workload(t)
		// Host directories need not exist yet: volumes are made just
		// before a start.
		future := w
		future.Volumes = map[string]string{}
		for name, vol := range w.Volumes {
			future.Volumes[name] = filepath.Join(vol, "not-yet")
		}
		if err := rt.Warm(ctx, a, future); err != nil {
			t.Fatal(err)
		}
		assertWarm(t, rt, a, true)
		assertRunning(t, a, false)
		assertSandboxes(t, a.Name)
		if err := rt.Checkpoint(ctx, a, t.TempDir(), false); !errors.Is(err, runtime.ErrNotRunning) {
			t.Fatalf("Checkpoint of a warm slot = %v, want ErrNotRunning", err)
		}
		// Again for the same workload: nothing changes.
		if err := rt.Warm(ctx, a, w); err != nil {
			t.Fatalf("Warm again: %v", err)
		}
		assertWarm(t, rt, a, true)
		if err := rt.Terminate(ctx, a); err != nil {
			t.Fatal(err)
		}
		assertWarm(t, rt, a, false)
		assertSandboxes(t)
		// A slot with a workload cannot be warmed.
		if err := rt.Run(ctx, a, w); err != nil {
			t.Fatal(err)
		}
		if err := rt.Warm(ctx, a, w); !errors.Is(err, runtime.ErrBusy) {
			t.Fatalf("Warm of a busy slot = %v, want ErrBusy", err)
		}
		assertRunning(t, a, true)
		assertWarm(t, rt, a, false)
	})

	t.Run("RunAndRestoreIntoWarmSlots", func(t *testing.T) {
		defer terminate(t)
		w := env.Workload(t)
		if err := rt.Warm(ctx, a, w); err != nil {
			t.Fatal(err)
		}
		if err := rt.Run(ctx, a, w); err != nil {
			t.Fatalf("Run in a warm slot: %v", err)
		}
		assertRunning(t, a, true)
		assertWarm(t, rt, a, false)
		assertSandboxes(t, a.Name)
		img := t.TempDir()
		if err := rt.Checkpoint(ctx, a, img, false); err != nil {
			t.Fatal(err)
		}
		// The restore gets volumes of its own, as after a suspend.
		moved := w
		moved.Volumes = map[string]string{}
		for name := range w.Volumes {
			moved.Volumes[name] = t.TempDir()
		}
		if err := rt.Warm(ctx, b, w); err != nil {
			t.Fatal(err)
		}
		if err := rt.Restore(ctx, b, moved, img); err != nil {
			t.Fatalf("Restore in a warm slot: %v", err)
		}
		assertRunning(t, b, true)
		assertWarm(t, rt, b, false)
		assertSandboxes(t, b.Name)
		if err := rt.Checkpoint(ctx, b, t.TempDir(), true); err != nil {
			t.Fatalf("Checkpoint after a restore in a warm slot: %v", err)
		}
	})

	t.Run("WarmSlotForAnotherWorkload", func(t *testing.T) {
		defer terminate(t)
		w := env.Workload(t)
		if err := rt.Run(ctx, a, w); err != nil {
			t.Fatal(err)
		}
		img := t.TempDir()
		if err := rt.Checkpoint(ctx, a, img, false); err != nil {
			t.Fatal(err)
		}
		other := withTemplate(w, func(tmpl *torporv1.TemplateSpec) {
			tmpl.Containers[0].Args = append(tmpl.Containers[0].Args, "--other")
		})
		renamed := w
		renamed.Actor += "-other"
		for name, warmFor := range map[string]runtime.Workload{"other args": other, "other actor": renamed} {
			if err := rt.Warm(ctx, b, warmFor); err != nil {
				t.Fatal(err)
			}
			// The start does not fail for it (a restore of another
			// actor may use it: Runtime.Warm).
			if err := rt.Restore(ctx, b, w, img); err != nil {
				t.Fatalf("Restore in a slot warm for %s: %v", name, err)
			}
			assertRunning(t, b, true)
			assertWarm(t, rt, b, false)
			assertSandboxes(t, b.Name)
			if err := rt.Terminate(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		// Warming for another workload replaces the warm sandbox; a
		// restore that fails leaves the slot without one.
		if err := rt.Warm(ctx, b, w); err != nil {
			t.Fatal(err)
		}
		if err := rt.Warm(ctx, b, other); err != nil {
			t.Fatal(err)
		}
		assertSandboxes(t, b.Name)
		if err := rt.Restore(ctx, b, other, img); err == nil {
			t.Fatal("restoring another workload's image in a warm slot succeeded")
		}
		assertSandboxes(t)
	})
}

func assertWarm(t *testing.T, rt runtime.Runtime, s runtime.Slot, want bool) {
	t.Helper()
	st, err := rt.Stats(context.Background(), s)
	if err != nil {
		t.Fatalf("Stats(%s): %v", s.Name, err)
	}
	if st.Warm != want {
		t.Fatalf("Stats(%s).Warm = %v, want %v", s.Name, st.Warm, want)
	}
}

// withTemplate returns w with a changed copy of its template.
func withTemplate(w runtime.Workload, change func(*torporv1.TemplateSpec)) runtime.Workload {
	tmpl := proto.Clone(w.Template).(*torporv1.TemplateSpec)
	change(tmpl)
	w.Template = tmpl
	return w
}

// Runsc finds the runsc binary for tests: $TORPOR_RUNSC, else bin/runsc at
// the module root. A missing binary fails the test: CI has it.
func Runsc(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("TORPOR_RUNSC"); p != "" {
		return p
	}
	dir, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "bin", "runsc")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("runsc not found at %s (%v): run `make runsc`, or set TORPOR_RUNSC", p, err)
	}
	return p
}

// RequireRoot fails the test unless it runs as root, which sandboxes and
// network namespaces need (CI runs tests as root).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (sandboxes, network namespaces); run the tests as root as CI does")
	}
}

// MountsUnder lists the mount points below dir (runtime.MountsUnder),
// failing t if they cannot be read.
func MountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	mounts, err := runtime.MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	return mounts
}
