package node

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/fake"
)

// suspend checkpoints actorUID FULL to storage out of worker, freeing it
// and asking for it warm, as the control plane's plain suspend does.
func (n *fakeNode) suspend(t *testing.T, actorUID, opID string, worker int) *torporv1.SnapshotSource {
	t.Helper()
	return n.checkpointOut(t, actorUID, opID, worker, true)
}

// checkpointOut checkpoints actorUID FULL to storage out of worker,
// freeing it, and asks for it warm after or not.
func (n *fakeNode) checkpointOut(t *testing.T, actorUID, opID string, worker int, warm bool) *torporv1.SnapshotSource {
	t.Helper()
	location := "s/" + actorUID + "/" + opID
	resp, err := n.client.Checkpoint(context.Background(), connect.NewRequest(&torporv1.CheckpointRequest{
		Op: op(actorUID, opID, n.worker(worker)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: location, Warm: warm,
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

// TestCheckpointWarmsOnlyWhenAsked: the control plane decides whether
// the worker a checkpoint frees is warmed (an eviction's is not); a
// checkpoint that does not ask, as from an older control plane, leaves
// it cold.
func TestCheckpointWarmsOnlyWhenAsked(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	for i, uid := range []string{"a1", "a2"} {
		if _, err := n.run(ctx, uid, "op-run-"+uid, i); err != nil {
			t.Fatal(err)
		}
	}
	n.checkpointOut(t, "a1", "op-evict", 0, false)
	n.checkpointOut(t, "a2", "op-suspend", 1, true)
	waitFor(t, "worker 1 to be warm", func() bool { return n.warm(t, 1) })
	// A stop waits for the warm-ups the checkpoints left running.
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	if n.calls("Warm", 0) != 0 {
		t.Fatalf("calls %v; want worker 0 left cold", n.rt.Calls())
	}
	n.start(t)
	if n.warm(t, 0) || n.calls("Warm", 0) != 0 {
		t.Fatalf("after a restart: worker 0 warm=%v, calls %v; want it cold", n.warm(t, 0), n.rt.Calls())
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

// warmForTemplate asks the agent to warm worker for the fake node's
// template, with no actor.
func (n *fakeNode) warmForTemplate(worker int) error {
	w := n.workload("")
	w.Actor = ""
	_, err := n.client.Warm(context.Background(), connect.NewRequest(&torporv1.WarmRequest{Worker: n.worker(worker), Workload: w}))
	return err
}

// TestWarmForTheTemplate: a worker warmed for a template (no actor)
// serves the restore of any of its actors, which reports it, and a
// restore into a worker another actor of the template left warm does
// too; a cold boot uses neither. Busy workers, actors named in the
// request, and a node with warming off are refused, naming why.
func TestWarmForTheTemplate(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	n.touch(t, 0, 2)
	snap := n.suspend(t, "a1", "op-suspend", 0)
	if err := n.warmForTemplate(1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "worker 1 to be warm", func() bool { return n.warm(t, 1) })
	resp, err := n.client.Restore(ctx, connect.NewRequest(&torporv1.RestoreRequest{
		Op: op("a1", "op-resume", n.worker(1)), Workload: n.workload("a1"),
		Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: snap,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c := n.lastStart(t, 1); !c.Warm || !resp.Msg.GetWarm() {
		t.Fatalf("restore %+v, response warm=%v: want it in the sandbox warmed for the template", c, resp.Msg.GetWarm())
	}
	if st := n.stats(t, 1); st.GetActorUid() != "a1" || st.GetMemoryBytes() != 2 {
		t.Fatalf("stats %v, want a1 with its memory", st)
	}

	// Worker 0, which a1 left warm, serves another actor's restore too.
	waitFor(t, "worker 0 to be warm for a1", func() bool { return n.warm(t, 0) })
	snap2 := n.suspend(t, "a1", "op-suspend-2", 1)
	moved := n.workload("a1")
	moved.ActorUid, moved.Actor = "a2", "actor-a2"
	if _, err := n.client.Restore(ctx, connect.NewRequest(&torporv1.RestoreRequest{
		Op: op("a2", "op-fork", n.worker(0)), Workload: moved,
		Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: snap2,
	})); err != nil {
		t.Fatal(err)
	}
	if c := n.lastStart(t, 0); !c.Warm {
		t.Fatalf("a2's restore %+v, want it in the sandbox a1 left warm", c)
	}

	// A cold boot does not use a sandbox warmed for the template.
	waitFor(t, "worker 1 to be warm for a1", func() bool { return n.warm(t, 1) })
	if err := n.terminate(ctx, "a1", "op-term", 1); err != nil {
		t.Fatal(err)
	}
	if err := n.warmForTemplate(1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "worker 1 to be warm for the template", func() bool { return n.warm(t, 1) })
	if _, err := n.run(ctx, "a3", "op-run-a3", 1); err != nil {
		t.Fatal(err)
	}
	if c := n.lastStart(t, 1); c.Warm {
		t.Fatalf("a3's cold boot %+v used the sandbox warmed with no actor's name", c)
	}

	for _, tt := range []struct {
		name string
		err  error
		code connect.Code
		says string
	}{
		{"busy worker", n.warmForTemplate(1), connect.CodeFailedPrecondition, "hosts actor a3"},
		{"actor named", func() error {
			_, err := n.client.Warm(ctx, connect.NewRequest(&torporv1.WarmRequest{Worker: n.worker(1), Workload: n.workload("a4")}))
			return err
		}(), connect.CodeInvalidArgument, "workload"},
	} {
		if connect.CodeOf(tt.err) != tt.code || !strings.Contains(tt.err.Error(), tt.says) {
			t.Errorf("%s: %v, want %v mentioning %q", tt.name, tt.err, tt.code, tt.says)
		}
	}
	off := newFakeNode(t, func(c *Config) { c.NoWarm = true })
	if err := off.warmForTemplate(0); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "warming is off") {
		t.Errorf("warm on a node with warming off: %v, want FailedPrecondition saying so", err)
	}
}

// TestWarmRacesStarts: a warm-up asked for while a restore claims the
// same worker never fails the restore nor leaves a warm sandbox beside
// the running workload; the restore uses the warm sandbox or not.
func TestWarmRacesStarts(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	snap := n.suspend(t, "a1", "op-suspend-0", 0)
	for i := range 20 {
		var wg sync.WaitGroup
		wg.Go(func() {
			// Refused once the restore holds the worker: either is fine.
			if err := n.warmForTemplate(1); err != nil && connect.CodeOf(err) != connect.CodeFailedPrecondition {
				t.Errorf("round %d: warm: %v", i, err)
			}
		})
		n.restoreFull(t, "a1", fmt.Sprintf("op-resume-%d", i), 1, snap)
		wg.Wait()
		if st := n.stats(t, 1); !st.GetRunning() || st.GetActorUid() != "a1" {
			t.Fatalf("round %d: stats %v, want a1 running", i, st)
		}
		snap = n.suspend(t, "a1", fmt.Sprintf("op-suspend-%d", i+1), 1)
		waitFor(t, "worker 1 to be warm", func() bool { return n.warm(t, 1) })
	}
	if sandboxes, err := n.rt.Sandboxes(ctx); err != nil || len(sandboxes) > 2 {
		t.Fatalf("sandboxes %v, %v; want at most the two warm workers", sandboxes, err)
	}
}
