package workflow

import (
	"errors"
	"slices"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// TestLocalCheckpointFilesGoWithTheirRecord: whichever route deletes the
// record of a paused actor's local checkpoint asks the node holding it to
// remove its files, and only for that snapshot (a durable one's go from
// snapshot storage); a node that does not answer keeps them, and the
// route goes on.
func TestLocalCheckpointFilesGoWithTheirRecord(t *testing.T) {
	deleteActor := func(e *env, durable *torporv1.Snapshot) {
		if err := e.engine.Delete(e.ctx, "default", "c1", DeleteOptions{}); err != nil {
			e.t.Fatal(err)
		}
		if _, err := e.store.Actors().Get(e.ctx, "default", "c1"); !errors.Is(err, store.ErrNotFound) {
			e.t.Fatalf("deleted actor still there: %v", err)
		}
		if !e.filesDeleted(durable.GetLocation()) {
			e.t.Fatalf("the durable snapshot's files stayed in snapshot storage (removed: %v)", e.objects.deleted)
		}
	}
	tests := []struct {
		name     string
		nodeDown bool
		// drop makes the control plane delete the local checkpoint's
		// record; durable is the actor's latest snapshot in storage.
		drop func(e *env, durable *torporv1.Snapshot)
	}{
		{name: "delete", drop: deleteActor},
		{name: "delete with the node down", nodeDown: true, drop: deleteActor},
		{name: "revert", drop: func(e *env, durable *torporv1.Snapshot) {
			if _, err := e.engine.Revert(e.ctx, "default", "c1", durable.GetMetadata().GetName()); err != nil {
				e.t.Fatal(err)
			}
		}},
		{name: "resume of a spoilt checkpoint", drop: func(e *env, _ *torporv1.Snapshot) {
			e.agents["n1"].failRestore = connect.NewError(connect.CodeDataLoss, errors.New("pages.img: sha256 mismatch"))
			if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); errdefs.Code(err) != connect.CodeDataLoss {
				e.t.Fatalf("resume of a spoilt checkpoint: %v, want DataLoss", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 1, "n1")
			e.createActor("c1")
			durable := e.cycle("c1")
			e.resume("c1", ResumeOptions{})
			paused, err := e.engine.Pause(e.ctx, "default", "c1")
			if err != nil {
				t.Fatal(err)
			}
			local := e.snapshot("default", paused.GetStatus().GetLocalCheckpoint())
			if local.GetNode() != "n1" {
				t.Fatalf("local checkpoint on node %q, want n1", local.GetNode())
			}
			agent := e.agents["n1"]
			agent.down.Store(tt.nodeDown)

			tt.drop(e, durable)
			if e.snapshotExists("default", local.GetMetadata().GetName()) {
				t.Fatal("the local checkpoint's record survived")
			}
			want := []string{local.GetLocation()}
			if tt.nodeDown {
				want = nil
				if agent.unanswered.Load() == 0 {
					t.Fatal("the node was not asked")
				}
			}
			if got := agent.droppedCheckpoints(); !slices.Equal(got, want) {
				t.Fatalf("node dropped checkpoints %v, want %v", got, want)
			}
			if e.filesDeleted(local.GetLocation()) {
				t.Fatal("snapshot storage was asked to remove a local checkpoint")
			}
		})
	}
}
