package node

import (
	"context"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func TestDropCheckpoint(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	local := filepath.Join(n.cfg.StateDir, "local")
	// chunks are the chunk objects of the node's local checkpoints.
	chunks := func(t *testing.T) map[string]bool {
		t.Helper()
		found := map[string]bool{}
		err := filepath.WalkDir(filepath.Join(local, "_chunks"), func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				found[path] = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return found
	}
	pause := func(t *testing.T, actorUID string, worker, touches int) *torporv1.SnapshotSource {
		t.Helper()
		if _, err := n.run(ctx, actorUID, "op-run-"+actorUID, worker); err != nil {
			t.Fatal(err)
		}
		n.touch(t, worker, touches)
		location := "s/" + actorUID + "/op-pause"
		resp, err := n.client.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{
			Op: op(actorUID, "op-pause-"+actorUID, n.worker(worker)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
			Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL, Location: location,
		}))
		if err != nil {
			t.Fatal(err)
		}
		return &torporv1.SnapshotSource{Location: location, ManifestDigest: resp.Msg.GetManifestDigest(), Node: n.name}
	}
	drop := func(location string) error {
		_, err := n.client.DropCheckpoint(ctx, connect.NewRequest(&torporv1.DropCheckpointRequest{Location: location}))
		return err
	}

	kept := pause(t, "a2", 1, 1)
	keptChunks := chunks(t)
	dropped := pause(t, "a1", 0, 3)
	if all := chunks(t); len(all) <= len(keptChunks) {
		t.Fatalf("a1's checkpoint added no chunk (%d before, %d after): the test proves nothing", len(keptChunks), len(all))
	}

	if err := drop(dropped.GetLocation()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(local, dropped.GetLocation())); !os.IsNotExist(err) {
		t.Fatalf("the dropped checkpoint's files: %v, want them gone", err)
	}
	if got := chunks(t); !maps.Equal(got, keptChunks) {
		t.Fatalf("local chunks after the drop: %v, want a2's alone: %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(keptChunks)))
	}
	// Idempotent: the same location again, or one never written.
	for _, location := range []string{dropped.GetLocation(), "s/a9/none"} {
		if err := drop(location); err != nil {
			t.Fatalf("drop %s: %v", location, err)
		}
	}

	// a2's checkpoint is whole: it restores.
	if _, err := n.client.Restore(ctx, connect.NewRequest(&torporv1.RestoreRequest{
		Op: op("a2", "op-resume", n.worker(0)), Workload: n.workload("a2"), Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: kept,
	})); err != nil {
		t.Fatalf("restore the other actor's checkpoint: %v", err)
	}
	if got := n.touchLines(t, "a2"); got != 1 {
		t.Fatalf("a2 restored with %d lines in its volume, want 1", got)
	}

	for _, location := range []string{"", "/s/a1/x", "s/../a1", "s/a1", "s/a1/x/y", "s//x", `s\a1\x`} {
		t.Run("Invalid "+location, func(t *testing.T) {
			wantCode(t, drop(location), connect.CodeInvalidArgument)
		})
	}
}
