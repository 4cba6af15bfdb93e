package node

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

func TestDropCheckpoint(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	trees := filepath.Join(n.cfg.StateDir, "local-trees")
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
	restore := func(t *testing.T, actorUID, opID string, src *torporv1.SnapshotSource) {
		t.Helper()
		if _, err := n.client.Restore(ctx, connect.NewRequest(&torporv1.RestoreRequest{
			Op: op(actorUID, opID, n.worker(0)), Workload: n.workload(actorUID), Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: src,
		})); err != nil {
			t.Fatalf("restore %s from %s: %v", actorUID, src.GetLocation(), err)
		}
	}

	kept := pause(t, "a2", 1, 1)
	// A copy of its files, for a local checkpoint of an earlier version
	// (below): a2's restore drops its tree.
	tree := filepath.Join(t.TempDir(), "tree")
	if err := os.CopyFS(tree, os.DirFS(filepath.Join(trees, kept.GetLocation(), "files"))); err != nil {
		t.Fatal(err)
	}
	dropped := pause(t, "a1", 0, 3)
	if _, err := os.Stat(filepath.Join(trees, dropped.GetLocation(), "manifest.json")); err != nil {
		t.Fatalf("a1's pause kept no tree on the node: %v", err)
	}

	if err := drop(dropped.GetLocation()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(trees, "s", "a1")); !os.IsNotExist(err) {
		t.Fatalf("the dropped checkpoint's directory: %v, want it gone with its files", err)
	}
	// Idempotent: the same location again, or one never written.
	for _, location := range []string{dropped.GetLocation(), "s/a9/none"} {
		if err := drop(location); err != nil {
			t.Fatalf("drop %s: %v", location, err)
		}
	}

	// a2's checkpoint is whole: it restores.
	restore(t, "a2", "op-resume", kept)
	if got := n.touchLines(t, "a2"); got != 1 {
		t.Fatalf("a2 restored with %d lines in its volume, want 1", got)
	}

	// A local checkpoint of an earlier version, kept as chunks, restores,
	// and its drop takes its chunks.
	if err := n.terminate(ctx, "a2", "op-t", 0); err != nil {
		t.Fatal(err)
	}
	chunked, err := snapshot.NewDirStore(filepath.Join(n.cfg.StateDir, "local"))
	if err != nil {
		t.Fatal(err)
	}
	old := &torporv1.SnapshotSource{Location: "s/a2/op-old-pause", Node: n.name}
	if _, old.ManifestDigest, _, err = snapshot.Upload(ctx, chunked, old.GetLocation(), tree); err != nil {
		t.Fatal(err)
	}
	restore(t, "a2", "op-resume-old", old)
	if got := n.touchLines(t, "a2"); got != 1 {
		t.Fatalf("a2 restored from an earlier version's checkpoint with %d lines in its volume, want 1", got)
	}
	if err := drop(old.GetLocation()); err != nil {
		t.Fatal(err)
	}
	// The restore's own drop of a2's checkpoints runs in the background
	// meanwhile, removing directories under the walk.
	var left []string
	if err := filepath.WalkDir(filepath.Join(n.cfg.StateDir, "local"), func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err == nil && d.Type().IsRegular() {
			left = append(left, path)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Fatalf("left of the earlier version's checkpoint after its drop: %v", left)
	}

	for _, location := range []string{"", "/s/a1/x", "s/../a1", "s/a1", "s/a1/x/y", "s//x", `s\a1\x`} {
		t.Run("Invalid "+location, func(t *testing.T) {
			wantCode(t, drop(location), connect.CodeInvalidArgument)
		})
	}
}

// TestLocalCheckpointSealed: a pause's tree is sealed off the pause's
// path: by a stopping agent at once (not sealDelay later), and by the
// next agent for one a killed agent left unsealed.
func TestLocalCheckpointSealed(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	location := "s/a1/op-pause"
	if _, err := n.client.Checkpoint(ctx, connect.NewRequest(&torporv1.CheckpointRequest{
		Op: op("a1", "op-pause", n.worker(0)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL, Location: location,
	})); err != nil {
		t.Fatal(err)
	}
	seal := filepath.Join(n.cfg.StateDir, "local-trees", location, "seal.json")
	if _, err := os.Stat(seal); !os.IsNotExist(err) {
		t.Fatalf("sealed as the pause answered (%v): the seal is on the pause's path", err)
	}
	stopped := time.Now()
	n.restart(t)
	if took := time.Since(stopped); took >= sealDelay {
		t.Errorf("the restart took %s: the stop waited out the seal delay (%s)", took, sealDelay)
	}
	if _, err := os.Stat(seal); err != nil {
		t.Fatalf("after the agent's stop: %v, want the tree sealed", err)
	}

	// A killed agent's unsealed tree: the next agent seals it.
	if err := os.Remove(seal); err != nil {
		t.Fatal(err)
	}
	n.restart(t)
	waitFor(t, "the next agent to seal the tree", func() bool {
		_, err := os.Stat(seal)
		return err == nil
	})
}
