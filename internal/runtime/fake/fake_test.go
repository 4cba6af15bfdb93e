package fake

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

var slotA, slotB = runtime.Slot{Name: "w0", IP: "10.0.0.2"}, runtime.Slot{Name: "w1", IP: "10.0.0.3"}

func workload(t *testing.T) runtime.Workload {
	t.Helper()
	rootfs, vol := t.TempDir(), t.TempDir()
	return runtime.Workload{
		ActorUID: "uid-1", Space: "s", Actor: "a",
		Template: &torporv1.TemplateSpec{
			Containers: []*torporv1.Container{{
				Name: "main", Command: []string{"/bin/app"}, Args: []string{"serve"},
				Mounts: []*torporv1.Mount{{Volume: "data", Path: "/data"}},
			}},
			Volumes: []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
		},
		Rootfs:  map[string]string{"main": rootfs},
		Volumes: map[string]string{"data": vol},
	}
}

// pod is workload with a second container, "side", mounting its volume.
func pod(t *testing.T) runtime.Workload {
	w := workload(t)
	w.Template.Containers = append(w.Template.Containers, &torporv1.Container{
		Name: "side", Command: []string{"/bin/side"}, Mounts: []*torporv1.Mount{{Volume: "data", Path: "/data"}},
	})
	w.Rootfs["side"] = t.TempDir()
	return w
}

func TestConformance(t *testing.T) {
	runtimetest.Conformance(t, runtimetest.Env{
		Runtime: New(), Slots: [2]runtime.Slot{slotA, slotB}, Workload: workload, Pod: pod, True: []string{"/bin/true"},
	})
}

func TestMemoryTravelsOnlyThroughTheImage(t *testing.T) {
	ctx := context.Background()
	f := New()
	w := workload(t)
	if err := f.Run(ctx, slotA, w); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := f.Touch(slotA.Name); err != nil {
			t.Fatal(err)
		}
	}
	img := t.TempDir()
	if err := f.Checkpoint(ctx, slotA, img, false); err != nil {
		t.Fatal(err)
	}
	if err := f.Restore(ctx, slotB, w, img); err != nil {
		t.Fatal(err)
	}
	if n, err := f.Touch(slotB.Name); err != nil || n != 4 {
		t.Fatalf("Touch after restore = %d, %v; want 4", n, err)
	}
	log, err := os.ReadFile(filepath.Join(w.Volumes["data"], TouchLog))
	if err != nil || strings.Count(string(log), "\n") != 4 {
		t.Fatalf("volume log %q, %v; want 4 lines", log, err)
	}
	st, err := f.Stats(ctx, slotB)
	if err != nil || !st.Running || st.MemoryBytes != 4 {
		t.Fatalf("Stats = %+v, %v; want running with memory 4", st, err)
	}

	// A cold boot starts from nothing.
	if err := f.Run(ctx, slotA, w); err != nil {
		t.Fatal(err)
	}
	if n, _ := f.Touch(slotA.Name); n != 1 {
		t.Fatalf("Touch after a cold boot = %d, want 1", n)
	}

	// A corrupt image is an error, not an empty workload.
	if err := f.Terminate(ctx, slotA); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(img, imageFile), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.Restore(ctx, slotA, w, img); err == nil || errors.Is(err, runtime.ErrNoImage) {
		t.Fatalf("Restore from a corrupt image = %v, want a parse error", err)
	}
}

func TestCrashKeepsTheSlotBusy(t *testing.T) {
	ctx := context.Background()
	f := New()
	w := workload(t)
	if err := f.Run(ctx, slotA, w); err != nil {
		t.Fatal(err)
	}
	f.Crash(slotA.Name)
	if st, _ := f.Stats(ctx, slotA); st.Running {
		t.Error("crashed workload reported running")
	}
	if err := f.Checkpoint(ctx, slotA, t.TempDir(), false); !errors.Is(err, runtime.ErrNotRunning) {
		t.Errorf("Checkpoint of a crashed workload = %v, want ErrNotRunning", err)
	}
	if err := f.Run(ctx, slotA, w); !errors.Is(err, runtime.ErrBusy) {
		t.Errorf("Run over a crashed workload = %v, want ErrBusy", err)
	}
	if got, _ := f.Sandboxes(ctx); len(got) != 1 {
		t.Errorf("Sandboxes = %v, want the crashed one", got)
	}
}

func TestFailNext(t *testing.T) {
	boom := errors.New("boom")
	// wantCalls counts the setup's calls too (Run, Checkpoint, Sandboxes
	// twice) besides the failed and the repeated one.
	cases := []struct {
		method    string
		wantCalls int
		call      func(f *Runtime, w runtime.Workload, img string) error
	}{
		{"Run", 3, func(f *Runtime, w runtime.Workload, _ string) error { return f.Run(context.Background(), slotB, w) }},
		{"Restore", 2, func(f *Runtime, w runtime.Workload, img string) error {
			return f.Restore(context.Background(), slotB, w, img)
		}},
		{"Checkpoint", 3, func(f *Runtime, _ runtime.Workload, img string) error {
			return f.Checkpoint(context.Background(), slotA, img, true)
		}},
		{"Terminate", 2, func(f *Runtime, _ runtime.Workload, _ string) error {
			return f.Terminate(context.Background(), slotA)
		}},
		{"Stats", 2, func(f *Runtime, _ runtime.Workload, _ string) error {
			_, err := f.Stats(context.Background(), slotA)
			return err
		}},
		{"Sandboxes", 4, func(f *Runtime, _ runtime.Workload, _ string) error {
			_, err := f.Sandboxes(context.Background())
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.method, func(t *testing.T) {
			ctx := context.Background()
			f := New()
			w := workload(t)
			if err := f.Run(ctx, slotA, w); err != nil {
				t.Fatal(err)
			}
			img := t.TempDir()
			if err := f.Checkpoint(ctx, slotA, img, true); err != nil {
				t.Fatal(err)
			}
			before, _ := f.Sandboxes(ctx)
			f.FailNext(tc.method, boom)
			if err := tc.call(f, w, img); !errors.Is(err, boom) {
				t.Fatalf("first call = %v, want the injected error", err)
			}
			if after, _ := f.Sandboxes(ctx); strings.Join(after, ",") != strings.Join(before, ",") {
				t.Fatalf("a failed call changed the sandboxes: %v -> %v", before, after)
			}
			if err := tc.call(f, w, img); err != nil {
				t.Fatalf("second call = %v, want success (faults are one-shot)", err)
			}
			var n int
			for _, c := range f.Calls() {
				if c.Method == tc.method {
					n++
				}
			}
			if n != tc.wantCalls {
				t.Errorf("recorded %d %s calls, want %d", n, tc.method, tc.wantCalls)
			}
		})
	}
}

func TestHang(t *testing.T) {
	ctx := context.Background()
	f := New()
	w := workload(t)
	if err := f.Run(ctx, slotA, w); err != nil {
		t.Fatal(err)
	}
	img := t.TempDir()

	release := f.Hang("Checkpoint")
	done := make(chan error, 1)
	go func() { done <- f.Checkpoint(ctx, slotA, img, false) }()
	select {
	case err := <-done:
		t.Fatalf("hung Checkpoint returned %v before release", err)
	case <-time.After(50 * time.Millisecond):
	}
	// Other methods and slots go on meanwhile.
	if err := f.Run(ctx, slotB, w); err != nil {
		t.Fatalf("Run while a Checkpoint hangs: %v", err)
	}
	release()
	release() // idempotent
	if err := <-done; err != nil {
		t.Fatalf("released Checkpoint: %v", err)
	}
	if _, err := os.Stat(filepath.Join(img, imageFile)); err != nil {
		t.Fatalf("released Checkpoint wrote no image: %v", err)
	}

	// A hang ends with the caller's context, doing nothing.
	f.Hang("Restore")
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := f.Restore(cctx, slotA, w, img); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung Restore with a deadline = %v, want DeadlineExceeded", err)
	}
	if _, ok := f.Workload(slotA.Name); ok {
		t.Fatal("a Restore that gave up still started the workload")
	}
	if err := f.Restore(ctx, slotA, w, img); err != nil {
		t.Fatalf("next Restore: %v", err)
	}
	if uid, ok := f.Workload(slotA.Name); !ok || uid != w.ActorUID {
		t.Fatalf("Workload(%s) = %q, %v", slotA.Name, uid, ok)
	}
}

func TestStartsRecordWhetherTheyUsedTheWarmSandbox(t *testing.T) {
	ctx := context.Background()
	f := New()
	w := workload(t)
	if err := f.Run(ctx, slotA, w); err != nil {
		t.Fatal(err)
	}
	img := t.TempDir()
	if err := f.Checkpoint(ctx, slotA, img, false); err != nil {
		t.Fatal(err)
	}
	if err := f.Warm(ctx, slotA, w); err != nil {
		t.Fatal(err)
	}
	if !f.Warmed(slotA.Name, w) {
		t.Fatal("Warmed after Warm = false")
	}
	other := w
	other.Actor = "b"
	if f.Warmed(slotA.Name, other) {
		t.Fatal("warm for another actor's name")
	}
	if err := f.Restore(ctx, slotA, w, img); err != nil {
		t.Fatal(err)
	}
	if err := f.Checkpoint(ctx, slotA, img, false); err != nil {
		t.Fatal(err)
	}
	// Warm for another actor of the shape: a restore uses it (the
	// runtime renames the guest), a cold boot does not.
	if err := f.Warm(ctx, slotA, other); err != nil {
		t.Fatal(err)
	}
	if err := f.Restore(ctx, slotA, w, img); err != nil {
		t.Fatal(err)
	}
	if err := f.Terminate(ctx, slotA); err != nil {
		t.Fatal(err)
	}
	if err := f.Warm(ctx, slotA, other); err != nil {
		t.Fatal(err)
	}
	if err := f.Run(ctx, slotA, w); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range f.Calls() {
		if c.Method == "Restore" || c.Method == "Run" {
			got = append(got, fmt.Sprintf("%s:%v", c.Method, c.Warm))
		}
	}
	if want := []string{"Run:false", "Restore:true", "Restore:true", "Run:false"}; !slices.Equal(got, want) {
		t.Fatalf("starts that used the warm sandbox: %v, want %v", got, want)
	}
}
