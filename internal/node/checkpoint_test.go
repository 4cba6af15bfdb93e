package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

func TestCheckpointAndRestore(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	n.touch(t, 0, 3)

	checkpoint := func(t *testing.T, opID string, worker int, scope torporv1.SnapshotScope, target torporv1.CheckpointTarget) *torporv1.SnapshotSource {
		t.Helper()
		location := "s/a1/" + opID
		resp, err := n.client.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{Op: op("a1", opID, n.worker(worker)), Scope: scope, Target: target, Location: location}))
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Msg.GetHasData() || resp.Msg.GetLocation() != location || !strings.HasPrefix(resp.Msg.GetManifestDigest(), "sha256:") {
			t.Fatalf("checkpoint response %v", resp.Msg)
		}
		if st := n.stats(t, worker); st.GetRunning() || st.GetActorUid() != "" {
			t.Fatalf("stats %v after checkpoint, want the worker free", st)
		}
		src := &torporv1.SnapshotSource{Location: location, ManifestDigest: resp.Msg.GetManifestDigest()}
		if target == torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL {
			src.Node = n.name
		}
		return src
	}
	restore := func(t *testing.T, opID string, worker int, scope torporv1.RestoreScope, snap, golden *torporv1.SnapshotSource) {
		t.Helper()
		resp, err := n.client.Restore(ctx, connect.NewRequest(&torporv1.RestoreRequest{Op: op("a1", opID, n.worker(worker)), Workload: n.workload("a1"), Scope: scope, Snapshot: snap, Golden: golden}))
		if err != nil {
			t.Fatal(err)
		}
		if slot, _ := n.net.Slot(ctx, n.worker(worker), worker); resp.Msg.GetWorkerIp() != slot.IP {
			t.Fatalf("restored at %s, want %s", resp.Msg.GetWorkerIp(), slot.IP)
		}
	}
	wantState := func(t *testing.T, worker int, memory int64, lines int) {
		t.Helper()
		if st := n.stats(t, worker); !st.GetRunning() || st.GetActorUid() != "a1" || st.GetMemoryBytes() != memory {
			t.Fatalf("stats %v, want a1 running with memory %d", st, memory)
		}
		if got := n.touchLines(t, "a1"); got != lines {
			t.Fatalf("%d lines in the volume, want %d", got, lines)
		}
	}

	full := checkpoint(t, "op-full", 0, torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE)
	restore(t, "op-r1", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, full, nil)
	wantState(t, 1, 3, 3)
	n.touch(t, 1, 1)

	data := checkpoint(t, "op-data", 1, torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA, torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE)
	restore(t, "op-r2", 0, torporv1.RestoreScope_RESTORE_SCOPE_DATA, data, nil)
	wantState(t, 0, 0, 4)

	local := checkpoint(t, "op-local", 0, torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL)
	restore(t, "op-r3", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, local, nil)
	wantState(t, 1, 0, 4)
	// Resumed, the actor is past its local checkpoint: the node drops it.
	waitFor(t, "the local checkpoint to be dropped", func() bool {
		_, err := os.Stat(filepath.Join(n.cfg.StateDir, "local-trees", local.GetLocation()))
		return os.IsNotExist(err)
	})

	if err := n.terminate(ctx, "a1", "op-t", 1); err != nil {
		t.Fatal(err)
	}
	restore(t, "op-r4", 1, torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN, data, full)
	wantState(t, 1, 3, 4)

	t.Run("NewActorOnGolden", func(t *testing.T) {
		// An actor without a snapshot of its own: the golden's memory and
		// empty volumes.
		_, err := n.client.Restore(ctx, connect.NewRequest(&torporv1.RestoreRequest{
			Op: op("a2", "op-g", n.worker(0)), Workload: n.workload("a2"),
			Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN, Golden: full,
		}))
		if err != nil {
			t.Fatal(err)
		}
		if st := n.stats(t, 0); st.GetActorUid() != "a2" || st.GetMemoryBytes() != 3 {
			t.Fatalf("stats %v, want a2 with the golden's memory 3", st)
		}
		entries, err := os.ReadDir(filepath.Join(n.volumeDir("a2"), "data"))
		if err != nil || len(entries) != 0 {
			t.Fatalf("a2's volume: %v, %v; want it empty", entries, err)
		}
		if err := n.terminate(ctx, "a2", "op-g-t", 0); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Errors", func(t *testing.T) {
		tests := []struct {
			name    string
			req     *torporv1.RestoreRequest
			code    connect.Code
			wantMsg string
		}{
			{"FULL from a DATA snapshot", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: data}, connect.CodeFailedPrecondition, "holds no memory image"},
			{"local checkpoint of another node", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: &torporv1.SnapshotSource{Location: local.GetLocation(), ManifestDigest: local.GetManifestDigest(), Node: "n2"}}, connect.CodeFailedPrecondition, "local checkpoint on node n2"},
			{"wrong digest", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: &torporv1.SnapshotSource{Location: full.GetLocation(), ManifestDigest: data.GetManifestDigest()}}, connect.CodeDataLoss, "digest mismatch"},
			{"missing snapshot", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA, Snapshot: &torporv1.SnapshotSource{Location: "s/a1/none", ManifestDigest: full.GetManifestDigest()}}, connect.CodeDataLoss, "s/a1/none"},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				// Another actor: a1 runs on worker 1.
				tt.req.Op = op("a9", fmt.Sprintf("op-bad-%d", i), n.worker(0))
				tt.req.Workload = n.workload("a9")
				_, err := n.client.Restore(ctx, connect.NewRequest(tt.req))
				wantCode(t, err, tt.code)
				if !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("error %v, want it to say %q", err, tt.wantMsg)
				}
				if st := n.stats(t, 0); st.GetRunning() || st.GetActorUid() != "" {
					t.Fatalf("stats %v after a failed restore, want free", st)
				}
			})
		}
		// Checkpointing a worker the actor is not on.
		_, err := n.client.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{Op: op("a1", "op-c-bad", n.worker(0)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: "s/a1/x"}))
		wantCode(t, err, connect.CodeFailedPrecondition)
	})

	t.Run("FailedCheckpointKeepsTheWorkload", func(t *testing.T) {
		n.rt.FailNext("Checkpoint", errors.New("disk full"))
		_, err := n.client.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{Op: op("a1", "op-c-fail", n.worker(1)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: "s/a1/fail"}))
		if err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Fatalf("checkpoint error %v, want the runtime's", err)
		}
		wantState(t, 1, 3, 4)
		if _, err := snapshot.ReadManifest(ctx, n.cfg.Snapshots, "s/a1/fail", full.GetManifestDigest()); !errors.Is(err, snapshot.ErrDataLoss) {
			t.Fatalf("a failed checkpoint left a snapshot: %v", err)
		}
	})
}
