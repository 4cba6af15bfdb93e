package node

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/fake"
)

// suspend checkpoints actorUID FULL to storage out of worker, freeing it.
func (n *fakeNode) suspend(t *testing.T, actorUID, opID string, worker int) *torporv1.SnapshotSource {
	t.Helper()
	location := "s/" + actorUID + "/" + opID
	resp, err := n.client.Checkpoint(context.Background(), connect.NewRequest(&torporv1.CheckpointRequest{
		Op: op(actorUID, opID, n.worker(worker)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: location,
	}))
	if err != nil {
		t.Fatal(err)
	}
	return &torporv1.SnapshotSource{Location: location, ManifestDigest: resp.Msg.GetManifestDigest()}
}

func (n *fakeNode) restoreFull(t *testing.T, actorUID, opID string, worker int, snap *torporv1.SnapshotSource) {
	t.Helper()
	if _, err := n.client.Restore(context.Background(), connect.NewRequest(&torporv1.RestoreRequest{
		Op: op(actorUID, opID, n.worker(worker)), Workload: n.workload(actorUID),
		Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: snap,
	})); err != nil {
		t.Fatal(err)
	}
}

// warm says whether the runtime holds worker warm.
func (n *fakeNode) warm(t *testing.T, worker int) bool {
	t.Helper()
	st, err := n.rt.Stats(context.Background(), runtime.Slot{Name: n.worker(worker)})
	if err != nil {
		t.Fatal(err)
	}
	return st.Warm
}

// lastStart is the worker's latest Run or Restore call.
func (n *fakeNode) lastStart(t *testing.T, worker int) fake.Call {
	t.Helper()
	calls := n.rt.Calls()
	for i := len(calls) - 1; i >= 0; i-- {
		if c := calls[i]; c.Slot == n.worker(worker) && (c.Method == "Run" || c.Method == "Restore") {
			return c
		}
	}
	t.Fatalf("no start on worker %d", worker)
	return fake.Call{}
}

func TestSuspendWarmsTheWorkerForTheActor(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	n.touch(t, 0, 3)
	snap := n.suspend(t, "a1", "op-suspend", 0)
	waitFor(t, "worker 0 to be warm", func() bool { return n.warm(t, 0) })
	if st := n.stats(t, 0); st.GetRunning() || st.GetActorUid() != "" {
		t.Fatalf("stats %v of a warm worker, want it free", st)
	}
	// The actor's resume there starts in the warm sandbox, with its state.
	n.restoreFull(t, "a1", "op-resume", 0, snap)
	if c := n.lastStart(t, 0); !c.Warm {
		t.Fatalf("restore %+v did not use the warm sandbox", c)
	}
	if st := n.stats(t, 0); !st.GetRunning() || st.GetActorUid() != "a1" || st.GetMemoryBytes() != 3 {
		t.Fatalf("stats %v, want a1 running with memory 3", st)
	}
	if lines := n.touchLines(t, "a1"); lines != 3 {
		t.Fatalf("a1's volume has %d lines, want 3", lines)
	}

	// Another actor on a worker warm for a1 starts as usual.
	n.suspend(t, "a1", "op-suspend-2", 0)
	waitFor(t, "worker 0 to be warm again", func() bool { return n.warm(t, 0) })
	if _, err := n.run(ctx, "a2", "op-run-a2", 0); err != nil {
		t.Fatal(err)
	}
	if c := n.lastStart(t, 0); c.Warm || c.ActorUID != "a2" {
		t.Fatalf("a2's run %+v, want a start without the sandbox warm for a1", c)
	}
	if st := n.stats(t, 0); !st.GetRunning() || st.GetActorUid() != "a2" || st.GetMemoryBytes() != 0 {
		t.Fatalf("stats %v, want a2 running", st)
	}
}

func TestRestartKeepsOrRemakesWarmWorkers(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	snap := n.suspend(t, "a1", "op-suspend", 0)
	waitFor(t, "worker 0 to be warm", func() bool { return n.warm(t, 0) })

	// A stop leaves no warm sandbox; the next start makes it again.
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	if sandboxes, err := n.rt.Sandboxes(ctx); err != nil || len(sandboxes) != 0 {
		t.Fatalf("sandboxes %v, %v after the stop; want none", sandboxes, err)
	}
	warms := n.calls("Warm", 0)
	n.start(t)
	waitFor(t, "worker 0 to be warm after the restart", func() bool { return n.warm(t, 0) })
	if n.calls("Warm", 0) != warms+1 {
		t.Fatalf("calls %v; want the warm sandbox made again once", n.rt.Calls())
	}

	// One a killed agent left behind is kept, not made again.
	stopped := n.agent
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	rw, err := stopped.machine.warmWorkload(ctx, stopped.machine.slots[0], n.workload("a1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.rt.Warm(ctx, stopped.machine.slots[0].rt, rw); err != nil {
		t.Fatal(err)
	}
	warms, terminates := n.calls("Warm", 0), n.calls("Terminate", 0)
	n.start(t)
	if !n.warm(t, 0) || n.calls("Terminate", 0) != terminates || n.calls("Warm", 0) != warms {
		t.Fatalf("after a restart: warm=%v, calls %v; want the warm sandbox kept", n.warm(t, 0), n.rt.Calls())
	}
	n.restoreFull(t, "a1", "op-resume", 0, snap)
	if c := n.lastStart(t, 0); !c.Warm {
		t.Fatalf("restore %+v did not use the warm sandbox", c)
	}
}

func TestTerminateDropsTheActorsWarmWorkers(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	snap := n.suspend(t, "a1", "op-suspend", 0)
	waitFor(t, "worker 0 to be warm", func() bool { return n.warm(t, 0) })
	n.restoreFull(t, "a1", "op-resume", 1, snap)
	if !n.warm(t, 0) {
		t.Fatal("worker 0 lost its warm sandbox when a1 resumed elsewhere")
	}
	if err := n.terminate(ctx, "a1", "op-term", 1); err != nil {
		t.Fatal(err)
	}
	if n.warm(t, 0) || n.warm(t, 1) {
		t.Fatal("a terminated actor's warm sandbox is left")
	}
	sandboxes, err := n.rt.Sandboxes(ctx)
	if err != nil || len(sandboxes) != 0 {
		t.Fatalf("sandboxes %v, %v; want none", sandboxes, err)
	}
}

func TestNoWarm(t *testing.T) {
	n := newFakeNode(t, func(c *Config) { c.NoWarm = true })
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	snap := n.suspend(t, "a1", "op-suspend", 0)
	n.restoreFull(t, "a1", "op-resume", 0, snap)
	if n.calls("Warm", 0) != 0 || n.lastStart(t, 0).Warm {
		t.Fatalf("calls %v, want no warm-up", n.rt.Calls())
	}
}
