package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// TestRestoreSpendsTheActorsSnapshot: the node keeps a snapshot's tree
// only while it can serve a restore. A restore that fails keeps the tree
// of the actor's snapshot for its retry; one that starts the workload
// drops it (the actor goes on from newer snapshots); the template's
// golden stays for the next new actor.
func TestRestoreSpendsTheActorsSnapshot(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	checkpoint := func(actorUID string, worker int) *torporv1.SnapshotSource {
		t.Helper()
		if _, err := n.run(ctx, actorUID, "op-run", worker); err != nil {
			t.Fatal(err)
		}
		location := "s/" + actorUID + "/op-c"
		resp, err := n.client.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{
			Op: op(actorUID, "op-c", n.worker(worker)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
			Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: location,
		}))
		if err != nil {
			t.Fatal(err)
		}
		return &torporv1.SnapshotSource{Location: location, ManifestDigest: resp.Msg.GetManifestDigest()}
	}
	restore := func(actorUID, opID string, worker int, scope torporv1.RestoreScope, snap, golden *torporv1.SnapshotSource) error {
		_, err := n.client.Restore(ctx, connect.NewRequest(&torporv1.RestoreRequest{
			Op: op(actorUID, opID, n.worker(worker)), Workload: n.workload(actorUID), Scope: scope, Snapshot: snap, Golden: golden,
		}))
		return err
	}
	// trees are the cached trees the runtime restored actorUID from.
	trees := func(actorUID string) []string {
		var dirs []string
		for _, c := range n.rt.Calls() {
			if c.Method == "Restore" && c.ActorUID == actorUID {
				dirs = append(dirs, filepath.Dir(c.ImageDir))
			}
		}
		return dirs
	}
	exists := func(path string) bool {
		_, err := os.Stat(path)
		return err == nil
	}
	own := checkpoint("a1", 0)
	golden := checkpoint("g", 1)

	n.rt.FailNext("Restore", errors.New("the sandbox would not start"))
	if err := restore("a1", "op-r1", 0, torporv1.RestoreScope_RESTORE_SCOPE_FULL, own, nil); err == nil {
		t.Fatal("the restore succeeded despite the runtime's failure")
	}
	if err := restore("a1", "op-r2", 0, torporv1.RestoreScope_RESTORE_SCOPE_FULL, own, nil); err != nil {
		t.Fatal(err)
	}
	a1 := trees("a1")
	if len(a1) != 2 || a1[0] != a1[1] || filepath.Dir(a1[0]) != filepath.Join(n.cfg.StateDir, "cache") {
		t.Fatalf("a1 restored from %v, want twice the tree its checkpoint put in the cache", a1)
	}
	waitFor(t, "the tree of the snapshot a1 started from to be dropped", func() bool { return !exists(a1[1]) })

	for i, actor := range []string{"a2", "a3"} {
		if err := restore(actor, "op-g", 1, torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN, nil, golden); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if err := n.terminate(ctx, actor, "op-t", 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A stopped agent has finished its background work (releases).
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	a2, a3 := trees("a2"), trees("a3")
	if len(a2) != 1 || len(a3) != 1 || a2[0] != a3[0] || !exists(a2[0]) {
		t.Errorf("new actors restored from %v and %v, want one golden tree, kept", a2, a3)
	}
	if names, err := os.ReadDir(filepath.Join(n.cfg.StateDir, "cache")); err != nil || len(names) != 1 {
		t.Errorf("the cache holds %v (%v), want the golden's tree only", names, err)
	}
}
