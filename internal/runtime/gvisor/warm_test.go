package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// TestRestoreIntoWarmSlot restores a workload into a slot warmed for it
// before its volume existed: the warm sandbox is the one that runs, and
// memory, root filesystem and the volume given at restore all come back.
func TestRestoreIntoWarmSlot(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, b := h.slots[0], h.slots[1]
	w := h.workload(t)
	// A read-only extra mount, as the node's identity directory.
	certs := t.TempDir()
	if err := os.WriteFile(filepath.Join(certs, "cert.pem"), []byte("cert"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.ExtraMounts = map[string]string{"/run/torpor/identity": certs}
	if err := h.rt.Run(ctx, a, w); err != nil {
		t.Fatal(err)
	}
	waitReady(t, a.IP)
	for i := 1; i <= 3; i++ {
		request(t, a.IP)
	}
	img := filepath.Join(t.TempDir(), "image")
	if err := h.rt.Checkpoint(ctx, a, img, false); err != nil {
		t.Fatal(err)
	}

	moved := w
	moved.Volumes = map[string]string{"data": filepath.Join(t.TempDir(), "data")}
	if err := h.rt.Warm(ctx, b, moved); err != nil {
		t.Fatal(err)
	}
	_, warm, err := h.rt.sandboxes(b.Name)
	if err != nil || len(warm) != 1 {
		t.Fatalf("warm sandboxes = %v, %v", warm, err)
	}
	// A warm sandbox leaves the slot's network alone: its address is
	// refused, not swallowed.
	if _, err := get(b.IP, "/healthz"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("request to a warm slot: %v, want connection refused", err)
	}
	// The volume is made after the warm-up, as a node does.
	if err := os.CopyFS(moved.Volumes["data"], os.DirFS(w.Volumes["data"])); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Restore(ctx, b, moved, img); err != nil {
		t.Fatal(err)
	}
	active, left, err := h.rt.sandboxes(b.Name)
	if err != nil || !slices.Equal(active, warm) || len(left) != 0 {
		t.Fatalf("after the restore: active %v, warm %v, %v; want the warm sandbox %v running", active, left, err, warm)
	}
	waitReady(t, b.IP)
	if got, want := request(t, b.IP), "count=4 volume=4 rootfs=4 greeting=hello"; got != want {
		t.Fatalf("after restore: %q, want %q", got, want)
	}
	data, err := os.ReadFile(filepath.Join(moved.Volumes["data"], "state.log"))
	if err != nil || strings.Count(string(data), "\n") != 4 {
		t.Fatalf("volume file on the host: %q, %v; want 4 lines", data, err)
	}
	if data, err := os.ReadFile(filepath.Join(w.Volumes["data"], "state.log")); err != nil || strings.Count(string(data), "\n") != 3 {
		t.Fatalf("the old volume changed: %q, %v", data, err)
	}
	// The read-only mount is read-only on the host too.
	if opts := mountOptions(t, mountPoint(h.rt.bundleDir(b.Name, warm[0]), 1)); !slices.Contains(opts, "ro") {
		t.Fatalf("identity mount options %v, want ro", opts)
	}
	// Checkpointing and removing it takes the volume's mount with it and
	// leaves the data.
	if err := h.rt.Checkpoint(ctx, b, t.TempDir(), false); err != nil {
		t.Fatal(err)
	}
	if got := runtimetest.MountsUnder(t, h.root); len(got) > 1 {
		t.Fatalf("mounts left after the checkpoint: %v", got)
	}
	if data, err := os.ReadFile(filepath.Join(moved.Volumes["data"], "state.log")); err != nil || strings.Count(string(data), "\n") != 4 {
		t.Fatalf("volume after the sandbox went: %q, %v", data, err)
	}
}

func TestRestartedRuntimeFindsWarmSandboxes(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a := h.slots[0]
	if err := h.rt.Warm(ctx, a, h.workload(t)); err != nil {
		t.Fatal(err)
	}
	again, err := New(Config{ConfigureNetwork: netns.Configure, Runsc: h.rt.runsc, RootDir: h.root})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := again.Sandboxes(ctx); err != nil || !slices.Equal(got, []string{a.Name}) {
		t.Fatalf("Sandboxes after restart = %v, %v; want [%s]", got, err, a.Name)
	}
	if st, err := again.Stats(ctx, a); err != nil || !st.Warm || st.Running {
		t.Fatalf("Stats after restart = %+v, %v; want warm", st, err)
	}
	// A warm sandbox whose processes died is no warm sandbox.
	_, warm, err := again.sandboxes(a.Name)
	if err != nil || len(warm) != 1 {
		t.Fatalf("warm sandboxes = %v, %v", warm, err)
	}
	if _, err := again.output(ctx, "kill", warm[0], "KILL"); err != nil {
		// A created container has no process to signal on every version;
		// kill the sandbox itself.
		if _, err := again.output(ctx, "delete", "--force", warm[0]); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := again.Stats(ctx, a); err != nil || st.Warm {
		t.Fatalf("Stats of a dead warm sandbox = %+v, %v; want not warm", st, err)
	}
	if err := again.Terminate(ctx, runtime.Slot{Name: a.Name}); err != nil {
		t.Fatal(err)
	}
	if got, err := again.Sandboxes(ctx); err != nil || len(got) != 0 {
		t.Fatalf("Sandboxes after Terminate = %v, %v", got, err)
	}
}

// TestNoLeaksWithWarmSlots moves one workload back and forth between two
// slots, warming each slot as it is emptied, so every restore lands in a
// warm sandbox; then checks that nothing outlives Terminate and teardown.
func TestNoLeaksWithWarmSlots(t *testing.T) {
	const cycles = 30
	h := newHarness(t)
	ctx := context.Background()
	w := h.workload(t)
	if err := h.rt.Warm(ctx, h.slots[1], w); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Run(ctx, h.slots[0], w); err != nil {
		t.Fatal(err)
	}
	waitReady(t, h.slots[0].IP)
	images := t.TempDir()
	for i := range cycles {
		from, to := h.slots[i%2], h.slots[(i+1)%2]
		if got := request(t, from.IP); !strings.HasPrefix(got, fmt.Sprintf("count=%d ", i+1)) {
			t.Fatalf("cycle %d: %q, want count=%d", i, got, i+1)
		}
		img := filepath.Join(images, strconv.Itoa(i))
		if err := h.rt.Checkpoint(ctx, from, img, false); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if err := h.rt.Warm(ctx, from, w); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		_, warm, err := h.rt.sandboxes(to.Name)
		if err != nil || len(warm) != 1 {
			t.Fatalf("cycle %d: warm sandboxes of %s = %v, %v", i, to.Name, warm, err)
		}
		if err := h.rt.Restore(ctx, to, w, img); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if active, _, err := h.rt.sandboxes(to.Name); err != nil || !slices.Equal(active, warm) {
			t.Fatalf("cycle %d: running %v, want the warm sandbox %v", i, active, warm)
		}
		if err := os.RemoveAll(img); err != nil {
			t.Fatal(err)
		}
		waitReady(t, to.IP)
	}
	if got := request(t, h.slots[cycles%2].IP); !strings.HasPrefix(got, fmt.Sprintf("count=%d volume=%d ", cycles+1, cycles+1)) {
		t.Fatalf("after %d cycles: %q", cycles, got)
	}
	if got := h.processes(t); len(got) != 4 {
		// A running sandbox and a warm one, each with its gofer.
		t.Errorf("runsc processes of this runtime mid-test: %v, want 4", got)
	}
	h.terminateAllAndClose(t)
	data, err := os.ReadFile(filepath.Join(w.Volumes["data"], "state.log"))
	if err != nil || strings.Count(string(data), "\n") != cycles+1 {
		t.Errorf("volume after teardown: %d lines, %v; want %d", strings.Count(string(data), "\n"), err, cycles+1)
	}
}

// mountOptions returns the per-mount options of the topmost mount at dir.
func mountOptions(t testing.TB, dir string) []string {
	t.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var opts []string
	for _, line := range strings.Split(string(info), "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[4] == dir {
			opts = strings.Split(f[5], ",")
		}
	}
	return opts
}

// TestRestoreOfAnotherActorInWarmSlot restores one actor into a slot
// warmed for another of the same template: the warm sandbox serves it,
// and the restored guest has its own actor's hostname, not the one the
// sandbox was made with. The name is then pinned in the guest: the next
// image records it and keeps it in another actor's warm sandbox without
// a rename, and a restore of that image as another actor (a fork) gets
// that actor's name. A cold boot never uses another actor's sandbox.
func TestRestoreOfAnotherActorInWarmSlot(t *testing.T) {
	if !canRename() {
		t.Fatalf("no program to set a hostname on %s: a warm sandbox serves only its own actor here", goruntime.GOARCH)
	}
	h := newHarness(t)
	ctx := context.Background()
	a, b := h.slots[0], h.slots[1]
	w := h.workload(t)
	other := w
	other.ActorUID, other.Actor = "actor-uid-2", "other"
	hostnameIs := func(s runtime.Slot, want string) {
		t.Helper()
		if err := h.rt.Exec(ctx, s, "main", []string{"/bin/counter", "hostname", want}); err != nil {
			t.Fatalf("hostname in %s: %v", s.Name, err)
		}
	}
	// restoreWarm restores wl from img into s, warm for warmFor, and
	// checks the warm sandbox is the one running.
	restoreWarm := func(s runtime.Slot, warmFor, wl runtime.Workload, img string) {
		t.Helper()
		if err := h.rt.Warm(ctx, s, warmFor); err != nil {
			t.Fatal(err)
		}
		_, warm, err := h.rt.sandboxes(s.Name)
		if err != nil || len(warm) != 1 {
			t.Fatalf("warm sandboxes = %v, %v", warm, err)
		}
		if err := h.rt.Restore(ctx, s, wl, img); err != nil {
			t.Fatal(err)
		}
		if active, _, err := h.rt.sandboxes(s.Name); err != nil || !slices.Equal(active, warm) {
			t.Fatalf("running %v, %v; want the warm sandbox %v", active, err, warm)
		}
		waitReady(t, s.IP)
	}
	if err := h.rt.Run(ctx, a, w); err != nil {
		t.Fatal(err)
	}
	waitReady(t, a.IP)
	request(t, a.IP)
	img := filepath.Join(t.TempDir(), "image")
	if err := h.rt.Checkpoint(ctx, a, img, false); err != nil {
		t.Fatal(err)
	}
	if got := pinned(img); got != "" {
		t.Fatalf("image of a booted guest pins hostname %q, want none", got)
	}

	restoreWarm(b, other, w, img)
	hostnameIs(b, "counter")
	if got, want := request(t, b.IP), "count=2 volume=2 rootfs=2 greeting=hello"; got != want {
		t.Fatalf("after the restore: %q, want %q", got, want)
	}
	pinnedImg := filepath.Join(t.TempDir(), "pinned")
	if err := h.rt.Checkpoint(ctx, b, pinnedImg, false); err != nil {
		t.Fatal(err)
	}
	if got := pinned(pinnedImg); got != "counter" {
		t.Fatalf("image pins hostname %q, want counter", got)
	}

	// Pinned: another warm sandbox keeps the name without a rename.
	restoreWarm(a, other, w, pinnedImg)
	hostnameIs(a, "counter")
	if err := h.rt.Terminate(ctx, a); err != nil {
		t.Fatal(err)
	}
	// A fork of the pinned image in a sandbox made for it is renamed.
	fork := other
	fork.Actor = "fork"
	if err := h.rt.Restore(ctx, a, fork, pinnedImg); err != nil {
		t.Fatal(err)
	}
	waitReady(t, a.IP)
	hostnameIs(a, "fork")
	if err := h.rt.Terminate(ctx, a); err != nil {
		t.Fatal(err)
	}

	// A cold boot discards a sandbox warm for another actor.
	if err := h.rt.Warm(ctx, a, other); err != nil {
		t.Fatal(err)
	}
	_, warm, err := h.rt.sandboxes(a.Name)
	if err != nil || len(warm) != 1 {
		t.Fatalf("warm sandboxes = %v, %v", warm, err)
	}
	if err := h.rt.Run(ctx, a, w); err != nil {
		t.Fatal(err)
	}
	if active, _, err := h.rt.sandboxes(a.Name); err != nil || len(active) != 1 || active[0] == warm[0] {
		t.Fatalf("running %v, %v; want a new sandbox, not %v", active, err, warm)
	}
	waitReady(t, a.IP)
	hostnameIs(a, "counter")
}
