package workflow

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

// deletionPaths are every path that deletes a snapshot record or its
// files. Each sets up the snapshot it deletes (setup) and deletes it
// (run); internal/arch checks that no other code calls the deletes.
var deletionPaths = []struct {
	name string
	// setup returns the snapshot run deletes: a record, or for the
	// orphan sweep a bare location.
	setup func(e *env) *torporv1.Snapshot
	run   func(e *env, s *torporv1.Snapshot)
	// tags says whether a tag can name the snapshot (a durable snapshot
	// of an actor), and so must keep it.
	tags bool
}{
	{name: "retention after a checkpoint", tags: true,
		setup: func(e *env) *torporv1.Snapshot { e.createActor("c1"); return e.cycle("c1") },
		run:   func(e *env, _ *torporv1.Snapshot) { e.cycle("c1"); e.cycle("c1") },
	},
	{name: "revert", tags: true,
		setup: func(e *env) *torporv1.Snapshot { e.createActor("c1"); e.cycle("c1"); return e.cycle("c1") },
		run: func(e *env, s *torporv1.Snapshot) {
			snaps, err := e.engine.actorSnapshots(e.ctx, e.actor("c1"))
			if err != nil {
				e.t.Fatal(err)
			}
			if _, err := e.engine.Revert(e.ctx, "default", "c1", snaps[0].GetMetadata().GetName()); err != nil {
				e.t.Fatal(err)
			}
		},
	},
	{name: "actor delete", tags: true,
		setup: func(e *env) *torporv1.Snapshot { e.createActor("c1"); return e.cycle("c1") },
		run: func(e *env, _ *torporv1.Snapshot) {
			if err := e.engine.Delete(e.ctx, "default", "c1", DeleteOptions{}); err != nil {
				e.t.Fatal(err)
			}
		},
	},
	{name: "untag of a deleted actor's snapshot", tags: true,
		setup: func(e *env) *torporv1.Snapshot {
			e.createActor("c1")
			s := e.cycle("c1")
			e.tag("default", "first", s.GetMetadata().GetName(), 0)
			if err := e.engine.Delete(e.ctx, "default", "c1", DeleteOptions{}); err != nil {
				e.t.Fatal(err)
			}
			return e.snapshot("default", s.GetMetadata().GetName())
		},
		run: func(e *env, _ *torporv1.Snapshot) {
			if err := e.engine.Untag(e.ctx, "default", "first", "", 0); err != nil {
				e.t.Fatal(err)
			}
		},
	},
	{name: "user delete, then the orphan sweep", tags: true,
		setup: func(e *env) *torporv1.Snapshot { e.createActor("c1"); s := e.cycle("c1"); e.cycle("c1"); return s },
		run: func(e *env, s *torporv1.Snapshot) {
			err := e.engine.DeleteSnapshot(e.ctx, "default", s.GetMetadata().GetName(), "", 0)
			if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
				e.t.Fatal(err)
			}
			e.sweepOrphan(s)
		},
	},
	{name: "orphan sweep",
		setup: func(e *env) *torporv1.Snapshot {
			location, err := snapshot.Location("default", "uid-gone", "orphan")
			if err != nil {
				e.t.Fatal(err)
			}
			return &torporv1.Snapshot{Location: location}
		},
		run: func(e *env, s *torporv1.Snapshot) { e.sweepOrphan(s) },
	},
	{name: "failed resume of a spoilt local checkpoint",
		setup: func(e *env) *torporv1.Snapshot { e.createActor("c1"); return e.paused("c1") },
		run: func(e *env, _ *torporv1.Snapshot) {
			e.agents["n1"].failRestore = connect.NewError(connect.CodeDataLoss, errors.New("pages.img: sha256 mismatch"))
			if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); errdefs.Code(err) != connect.CodeDataLoss {
				e.t.Fatalf("resume of a spoilt checkpoint: %v, want DataLoss", err)
			}
		},
	},
	{name: "revert dropping a local checkpoint",
		setup: func(e *env) *torporv1.Snapshot { e.createActor("c1"); return e.paused("c1") },
		run: func(e *env, _ *torporv1.Snapshot) {
			if _, err := e.engine.Revert(e.ctx, "default", "c1", e.actor("c1").GetStatus().GetLatestSnapshot()); err != nil {
				e.t.Fatal(err)
			}
		},
	},
	{name: "template delete",
		setup: func(e *env) *torporv1.Snapshot {
			if err := e.engine.BuildGoldens(e.ctx); err != nil {
				e.t.Fatal(err)
			}
			return e.snapshot("default", e.revision("counter@1").GetStatus().GetGoldenSnapshot())
		},
		run: func(e *env, _ *torporv1.Snapshot) {
			if err := e.engine.DeleteTemplate(e.ctx, "default", "counter", 0, "", 0); err != nil {
				e.t.Fatal(err)
			}
		},
	},
	{name: "forced delete of an interrupted suspend",
		setup: func(e *env) *torporv1.Snapshot {
			e.createActor("c1")
			a := e.resume("c1", ResumeOptions{})
			target := newSnapshotName(e.engine.now())
			a.Status.State = torporv1.ActorState_ACTOR_STATE_SUSPENDING
			a.Status.Operation = &torporv1.ActorOperation{Id: newOperationID(), Kind: torporv1.OperationKind_OPERATION_KIND_SUSPEND, TargetSnapshot: target, PreviousState: torporv1.ActorState_ACTOR_STATE_RUNNING}
			if _, err := e.store.Actors().Update(e.ctx, a); err != nil {
				e.t.Fatal(err)
			}
			location, err := snapshot.Location("default", a.GetMetadata().GetUid(), target)
			if err != nil {
				e.t.Fatal(err)
			}
			return &torporv1.Snapshot{Location: location} // the checkpoint never got a record
		},
		run: func(e *env, _ *torporv1.Snapshot) {
			if err := e.engine.Delete(e.ctx, "default", "c1", DeleteOptions{Force: true}); err != nil {
				e.t.Fatal(err)
			}
		},
	},
}

// TestEveryDeletionPathKeepsReferencedSnapshots: every path that deletes
// a snapshot keeps its files while another record names their location
// (a fork's, or its source's), keeps the record and files while a tag
// names it, and removes what nothing references. All of them ask
// referencesOf; breaking it fails every row.
func TestEveryDeletionPathKeepsReferencedSnapshots(t *testing.T) {
	references := []struct {
		name string
		// refer makes s referenced; nil leaves it unreferenced.
		refer func(e *env, s *torporv1.Snapshot)
		// keepsRecord: the reference holds the record, not only the files.
		keepsRecord bool
		tagOnly     bool
	}{
		{name: "unreferenced"},
		{name: "a record sharing its files", refer: (*env).shareFiles},
		{name: "a tag", refer: func(e *env, s *torporv1.Snapshot) { e.tag("default", "keep", s.GetMetadata().GetName(), 0) }, keepsRecord: true, tagOnly: true},
	}
	for _, p := range deletionPaths {
		for _, ref := range references {
			if ref.tagOnly && !p.tags {
				continue
			}
			t.Run(p.name+"/"+ref.name, func(t *testing.T) {
				e := newEnv(t, 1, "n1")
				s := p.setup(e)
				if ref.refer != nil {
					ref.refer(e, s)
				}
				p.run(e, s)
				if name := s.GetMetadata().GetName(); name != "" && e.snapshotExists("default", name) != ref.keepsRecord {
					t.Errorf("record %s exists: %v, want %v", name, !ref.keepsRecord, ref.keepsRecord)
				}
				if gone, want := e.filesGone(s), ref.refer == nil; gone != want {
					t.Errorf("files at %s removed: %v, want %v", s.GetLocation(), gone, want)
				}
			})
		}
	}
}

// TestDeleteSnapshotRefusesHeldSnapshots: a user's delete refuses a
// snapshot that is an actor's current state, that a tag names, or that is
// a template's golden snapshot, and keeps its record.
func TestDeleteSnapshotRefusesHeldSnapshots(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	tagged := e.cycle("c1")
	e.tag("default", "v1", tagged.GetMetadata().GetName(), 0)
	latest := e.cycle("c1")
	e.createActor("c2")
	local := e.paused("c2")
	if err := e.engine.BuildGoldens(e.ctx); err != nil {
		t.Fatal(err)
	}
	golden := e.revision("counter@1").GetStatus().GetGoldenSnapshot()
	for _, tt := range []struct{ name, snapshot, holder string }{
		{"latest snapshot", latest.GetMetadata().GetName(), "the current state of actor c1"},
		{"local checkpoint", local.GetMetadata().GetName(), "the current state of actor c2"},
		{"tagged", tagged.GetMetadata().GetName(), "tagged v1: untag it first"},
		{"golden", golden, "the golden snapshot of template counter@1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := e.engine.DeleteSnapshot(e.ctx, "default", tt.snapshot, "", 0)
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tt.holder) {
				t.Fatalf("delete: %v, want FailedPrecondition naming %q", err, tt.holder)
			}
			if !e.snapshotExists("default", tt.snapshot) {
				t.Fatal("the record went")
			}
		})
	}
}

// paused resumes actor name (suspended once before, so that it has a
// durable snapshot too) and pauses it on n1, returning its local
// checkpoint.
func (e *env) paused(name string) *torporv1.Snapshot {
	e.t.Helper()
	e.cycle(name)
	e.resume(name, ResumeOptions{})
	a, err := e.engine.Pause(e.ctx, "default", name)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.snapshot("default", a.GetStatus().GetLocalCheckpoint())
}

// shareFiles writes a record of another actor naming s's location, as a
// fork's first snapshot does.
func (e *env) shareFiles(s *torporv1.Snapshot) {
	e.t.Helper()
	if _, err := e.store.Snapshots().Create(e.ctx, &torporv1.Snapshot{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "sharing"},
		ActorUid: "uid-fork", ActorName: "fork", Location: s.GetLocation(), Node: s.GetNode(),
	}); err != nil {
		e.t.Fatal(err)
	}
}

// sweepOrphan runs the orphan sweep's question for s's location and records
// the files as removed when the answer lets them go, as
// snapshot.SweepOrphans would.
func (e *env) sweepOrphan(s *torporv1.Snapshot) {
	e.t.Helper()
	referenced, err := e.engine.LocationReferenced(e.ctx, s.GetLocation())
	if err != nil {
		e.t.Fatal(err)
	}
	if !referenced {
		if err := e.objects.DeleteSnapshot(e.ctx, s.GetLocation()); err != nil {
			e.t.Fatal(err)
		}
	}
}

// filesGone reports whether s's files were removed: from snapshot
// storage, or by its node for a local checkpoint.
func (e *env) filesGone(s *torporv1.Snapshot) bool {
	if s.GetNode() != "" {
		return slices.Contains(e.agents[s.GetNode()].droppedCheckpoints(), s.GetLocation())
	}
	return e.filesDeleted(s.GetLocation())
}
