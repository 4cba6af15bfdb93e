package gvisor

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

func TestRestartedRuntimeFindsItsSandboxes(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	b := h.slots[1]
	if err := h.rt.Run(ctx, b, h.workload(t)); err != nil {
		t.Fatal(err)
	}
	again, err := New(Config{ConfigureNetwork: netns.Configure, Runsc: h.rt.runsc, RootDir: h.root})
	if err != nil {
		t.Fatal(err)
	}
	got, err := again.Sandboxes(ctx)
	if err != nil || !slices.Equal(got, []string{b.Name}) {
		t.Fatalf("Sandboxes after restart = %v, %v; want [%s]", got, err, b.Name)
	}
	// Only the name is known for a slot the node no longer has.
	if err := again.Terminate(ctx, runtime.Slot{Name: b.Name}); err != nil {
		t.Fatal(err)
	}
	if got, err := again.Sandboxes(ctx); err != nil || len(got) != 0 {
		t.Fatalf("Sandboxes after Terminate = %v, %v", got, err)
	}
}

// TestNoLeaks moves one workload back and forth between two slots many
// times, then checks that nothing it made outlives Terminate and teardown.
func TestNoLeaks(t *testing.T) {
	const cycles = 100
	h := newHarness(t)
	ctx := context.Background()
	w := h.workload(t)
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
		if err := h.rt.Restore(ctx, to, w, img); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if err := os.RemoveAll(img); err != nil {
			t.Fatal(err)
		}
		waitReady(t, to.IP)
	}
	if got := request(t, h.slots[cycles%2].IP); !strings.HasPrefix(got, fmt.Sprintf("count=%d volume=%d ", cycles+1, cycles+1)) {
		t.Fatalf("after %d cycles: %q", cycles, got)
	}
	if got := h.processes(t); len(got) != 2 {
		// One sandbox and its gofer.
		t.Errorf("runsc processes of this runtime mid-test: %v, want 2", got)
	}
	h.terminateAllAndClose(t)
	if err := h.net.TeardownAll(ctx); err != nil {
		t.Fatal(err)
	}
	if left := networkLeftovers(t); len(left) != 0 {
		t.Errorf("network left after TeardownAll: %v", left)
	}
}

// processes lists the pids and command lines of runsc processes of this
// runtime (others may run on the host).
func (h *harness) processes(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), "--root="+h.rt.runscDir+"\x00") {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return out
}

// cgroupsOf lists cgroups named after sandboxes of slots (runsc names a
// sandbox's cgroup after its id) in every hierarchy.
func cgroupsOf(t testing.TB, slots []runtime.Slot) []string {
	t.Helper()
	var out []string
	for _, s := range slots {
		found, err := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", s.Name+idSep+"*"))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, found...)
		found, _ = filepath.Glob(filepath.Join("/sys/fs/cgroup", s.Name+idSep+"*"))
		out = append(out, found...)
	}
	return out
}

func networkLeftovers(t testing.TB) []string {
	t.Helper()
	var out []string
	entries, _ := os.ReadDir(netns.Dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "torpor-"+testNode+"-") {
			out = append(out, "namespace "+e.Name())
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Alias, "torpor-"+testNode+"-") || l.Attrs().Name == testBridge {
			out = append(out, "link "+l.Attrs().Name)
		}
	}
	return out
}

// listTree lists the paths under dir, directories with a trailing slash.
func listTree(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// terminateAllAndClose terminates every slot and closes the runtime,
// checking that no process, mount, cgroup or file of it is left.
func (h *harness) terminateAllAndClose(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for _, s := range h.slots {
		if err := h.rt.Terminate(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.processes(t); len(got) != 0 {
		t.Errorf("runsc processes left after Terminate: %v", got)
	}
	if got := runtimetest.MountsUnder(t, h.root); len(got) > 1 {
		// runsc's shared gofer namespace stays until Close.
		t.Errorf("mounts left after Terminate: %v", got)
	}
	if got := cgroupsOf(t, h.slots[:]); len(got) != 0 {
		t.Errorf("cgroups left after Terminate: %v", got)
	}
	if err := h.rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := runtimetest.MountsUnder(t, h.root); len(got) != 0 {
		t.Errorf("mounts left after Close: %v", got)
	}
	if files := listTree(t, h.root); !slices.Equal(files, []string{"runsc/", "slots/"}) {
		t.Errorf("files left under the runtime root: %v", files)
	}
}

// TestSandboxRunscDoesNotHold: a sandbox runsc does not hold whole (its
// runsc command died with its agent before runsc recorded it, or while it
// wrote the record, or it exited after saving itself) is reported stopped,
// not as an error a restarting agent would stop on, and Terminate removes
// it with every process it started.
func TestSandboxRunscDoesNotHold(t *testing.T) {
	// Short names: runsc's socket path under the test's directory is
	// bounded.
	tests := []struct {
		name string
		// make leaves slot a's sandbox in the state under test: a bundle
		// runsc never recorded, or a running sandbox whose record is
		// empty or half-written.
		make func(t *testing.T, h *harness, a runtime.Slot)
	}{
		{"unrecorded", func(t *testing.T, h *harness, a runtime.Slot) {
			id, err := h.rt.newID(a.Name)
			if err != nil {
				t.Fatal(err)
			}
			dir := h.rt.bundleDir(a.Name, id)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"empty", func(t *testing.T, h *harness, a runtime.Slot) {
			tearRecord(t, h, a, func([]byte) []byte { return nil })
		}},
		{"torn", func(t *testing.T, h *harness, a runtime.Slot) {
			tearRecord(t, h, a, func(b []byte) []byte { return b[:len(b)/2] })
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			a := h.slots[0]
			tt.make(t, h, a)
			st, err := h.rt.Stats(ctx, a)
			if err != nil || st.Running {
				t.Fatalf("Stats of a sandbox runsc does not hold = %+v, %v; want stopped, no error", st, err)
			}
			if err := h.rt.Terminate(ctx, a); err != nil {
				t.Fatal(err)
			}
			if got, err := h.rt.Sandboxes(ctx); err != nil || len(got) != 0 {
				t.Fatalf("Sandboxes after Terminate = %v, %v", got, err)
			}
			h.terminateAllAndClose(t)
		})
	}
}

// tearRecord runs a workload in slot a and rewrites runsc's record of its
// sandbox as a runsc command killed while writing it would leave it.
func tearRecord(t *testing.T, h *harness, a runtime.Slot, tear func([]byte) []byte) {
	t.Helper()
	if err := h.rt.Run(context.Background(), a, h.workload(t)); err != nil {
		t.Fatal(err)
	}
	waitReady(t, a.IP)
	ids, err := h.rt.bundles(a.Name)
	if err != nil || len(ids) != 1 {
		t.Fatalf("bundles = %v, %v", ids, err)
	}
	state := h.rt.stateFile(ids[0], ids[0])
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(state, tear(b), 0o640); err != nil {
		t.Fatal(err)
	}
}
