package workflow

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// cycle resumes and suspends actor name, returning its new snapshot.
func (e *env) cycle(name string) *torporv1.Snapshot {
	e.t.Helper()
	e.resume(name, ResumeOptions{})
	return e.snapshot("default", e.suspend(name).GetStatus().GetLatestSnapshot())
}

func (e *env) snapshot(space, name string) *torporv1.Snapshot {
	e.t.Helper()
	s, err := e.store.Snapshots().Get(e.ctx, space, name)
	if err != nil {
		e.t.Fatalf("snapshot %s/%s: %v", space, name, err)
	}
	return s
}

func (e *env) snapshotExists(space, name string) bool {
	e.t.Helper()
	_, err := e.store.Snapshots().Get(e.ctx, space, name)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		e.t.Fatal(err)
	}
	return err == nil
}

func (e *env) filesDeleted(location string) bool {
	e.objects.mu.Lock()
	defer e.objects.mu.Unlock()
	return slices.Contains(e.objects.deleted, location)
}

func (e *env) tag(space, tag, snapshot string, scope torporv1.SnapshotTagScope) {
	e.t.Helper()
	if _, err := e.engine.Tag(e.ctx, space, tag, snapshot, scope); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) eventReasons(space, name string) string {
	e.t.Helper()
	a, err := e.store.Actors().Get(e.ctx, space, name)
	if err != nil {
		e.t.Fatal(err)
	}
	evs, err := e.store.Events(e.ctx, a.GetMetadata().GetUid(), 0)
	if err != nil {
		e.t.Fatal(err)
	}
	var reasons []string
	for _, ev := range evs {
		reasons = append(reasons, ev.Reason)
	}
	return strings.Join(reasons, "\n")
}

// TestTagKeepsSnapshotFromRetention: retention (keep 2) never deletes a
// tagged snapshot, nor does deleting its actor; untagging lets retention
// collect it, or removes it at once when its actor is gone.
func TestTagKeepsSnapshotFromRetention(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	first := e.cycle("c1")
	e.tag("default", "prepared", first.GetMetadata().GetName(), 0)
	second := e.cycle("c1")
	for range 3 {
		e.cycle("c1")
	}
	if !e.snapshotExists("default", first.GetMetadata().GetName()) || e.filesDeleted(first.GetLocation()) {
		t.Fatal("retention deleted the tagged snapshot")
	}
	if e.snapshotExists("default", second.GetMetadata().GetName()) || !e.filesDeleted(second.GetLocation()) {
		t.Fatal("retention kept an untagged snapshot beyond keep 2")
	}

	if err := e.engine.Untag(e.ctx, "default", "prepared", "", 0); err != nil {
		t.Fatal(err)
	}
	if !e.snapshotExists("default", first.GetMetadata().GetName()) {
		t.Fatal("untagging the snapshot of a live actor removed it at once; retention should")
	}
	e.cycle("c1")
	if e.snapshotExists("default", first.GetMetadata().GetName()) || !e.filesDeleted(first.GetLocation()) {
		t.Fatal("retention did not collect the untagged snapshot")
	}

	last := e.snapshot("default", e.actor("c1").GetStatus().GetLatestSnapshot())
	e.tag("default", "final", last.GetMetadata().GetName(), torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_PUBLISHED)
	if err := e.engine.Delete(e.ctx, "default", "c1", DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !e.snapshotExists("default", last.GetMetadata().GetName()) || e.filesDeleted(last.GetLocation()) {
		t.Fatal("deleting the actor deleted its tagged snapshot")
	}
	if err := e.engine.Untag(e.ctx, "default", "final", "", 0); err != nil {
		t.Fatal(err)
	}
	if e.snapshotExists("default", last.GetMetadata().GetName()) || !e.filesDeleted(last.GetLocation()) {
		t.Fatal("untagging the snapshot of a deleted actor left it")
	}
}

// TestTagRefusesLocalCheckpoints: only snapshots in storage are tagged.
func TestTagRefusesLocalCheckpoints(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	e.resume("c1", ResumeOptions{})
	p, err := e.engine.Pause(e.ctx, "default", "c1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.engine.Tag(e.ctx, "default", "t", p.GetStatus().GetLocalCheckpoint(), 0)
	wantCodeErr(t, err, connect.CodeFailedPrecondition, "local checkpoint")
}

// TestForkSharesTheSourceSnapshot: a fork resumes from its source's
// snapshot files (no copy), with its own identity and told it is a fork;
// the files outlive the source's record while the fork's names them.
func TestForkSharesTheSourceSnapshot(t *testing.T) {
	e := newEnv(t, 2, "n1")
	e.createActor("c1")
	src := e.cycle("c1")

	var forks []*torporv1.Actor
	for _, name := range []string{"f1", "f2", "f3"} {
		f, err := e.engine.Fork(e.ctx, "default", name, ForkOptions{Actor: "c1"})
		if err != nil {
			t.Fatal(err)
		}
		wantState(t, f, torporv1.ActorState_ACTOR_STATE_SUSPENDED)
		forks = append(forks, f)
	}
	ref := e.snapshot("default", forks[0].GetStatus().GetLatestSnapshot())
	if ref.GetLocation() != src.GetLocation() || ref.GetForkedFrom() != "default/"+src.GetMetadata().GetName() ||
		ref.GetActorUid() != forks[0].GetMetadata().GetUid() || ref.GetForkedFromActor() != "default/c1" {
		t.Fatalf("fork's snapshot %v, want the source's files (%s) under the fork", ref, src.GetLocation())
	}
	if !strings.Contains(e.eventReasons("default", "f1"), "forked from actor default/c1") ||
		!strings.Contains(e.eventReasons("default", "c1"), "forked as default/f3") {
		t.Fatalf("events do not record the fork:\n%s\n%s", e.eventReasons("default", "f1"), e.eventReasons("default", "c1"))
	}

	e.resume("f1", ResumeOptions{})
	r := e.agents["n1"].lastRestore()
	if r.GetScope() != torporv1.RestoreScope_RESTORE_SCOPE_FULL || r.GetSnapshot().GetLocation() != src.GetLocation() ||
		r.GetWorkload().GetActor() != "f1" || r.GetWorkload().GetActorUid() != forks[0].GetMetadata().GetUid() || r.GetWorkload().GetForkedFrom() != "default/c1" {
		t.Fatalf("fork's first restore: %v", r)
	}

	// The source moves on: retention drops its record, not the files the
	// forks still restore from.
	e.suspend("f1")
	e.cycle("c1")
	e.cycle("c1")
	if e.snapshotExists("default", src.GetMetadata().GetName()) {
		t.Fatal("retention kept the source's old snapshot record")
	}
	if e.filesDeleted(src.GetLocation()) {
		t.Fatal("retention deleted files forks still name")
	}
	e.resume("f2", ResumeOptions{})
	if got := e.agents["n1"].lastRestore().GetSnapshot().GetLocation(); got != src.GetLocation() {
		t.Fatalf("second fork restored %s, want %s", got, src.GetLocation())
	}
	// Once every fork has moved past it, the files go.
	e.suspend("f2")
	for _, f := range []string{"f1", "f2"} {
		e.cycle(f)
	}
	if err := e.engine.Delete(e.ctx, "default", "f3", DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !e.filesDeleted(src.GetLocation()) {
		t.Fatal("the shared files outlived every record that named them")
	}
	// A later restore of a fork is its own state, not a fork's start.
	e.resume("f1", ResumeOptions{})
	if got := e.agents["n1"].lastRestore().GetWorkload().GetForkedFrom(); got != "" {
		t.Fatalf("a fork's later restore says forked from %q", got)
	}
}

// TestForkOfARunningActor: the source is checkpointed for the fork and
// runs on.
func TestForkOfARunningActor(t *testing.T) {
	e := newEnv(t, 2, "n1")
	e.createActor("c1")
	e.resume("c1", ResumeOptions{})
	f, err := e.engine.Fork(e.ctx, "default", "f1", ForkOptions{Actor: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	c1 := e.actor("c1")
	wantState(t, c1, torporv1.ActorState_ACTOR_STATE_RUNNING)
	if got := e.snapshot("default", f.GetStatus().GetLatestSnapshot()).GetLocation(); got != e.snapshot("default", c1.GetStatus().GetLatestSnapshot()).GetLocation() {
		t.Fatalf("fork shares %s, not the snapshot the source was checkpointed to", got)
	}
	if _, err := e.engine.Fork(e.ctx, "default", "f2", ForkOptions{Actor: "nope"}); err == nil || !strings.Contains(err.Error(), "default/nope") {
		t.Fatalf("fork of a missing actor: %v", err)
	}
}

// TestForkAcrossSpaces: another space forks only from a published tag,
// onto a template of its own, checked with the repoint rules.
func TestForkAcrossSpaces(t *testing.T) {
	e := newEnv(t, 2, "n1")
	if _, err := e.store.Spaces().Create(e.ctx, &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: "team"}}); err != nil {
		t.Fatal(err)
	}
	counter := e.revision("counter@1").GetSpec()
	e.applyIn("team", "counter", counter)
	other := spec("gvisor", []string{"data"}, map[string][]string{"main": {"data:/data"}})
	e.applyIn("team", "other", other)
	e.createActor("c1")
	src := e.cycle("c1")
	e.tag("default", "private", src.GetMetadata().GetName(), torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_SPACE)
	e.tag("default", "public", src.GetMetadata().GetName(), torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_PUBLISHED)

	_, err := e.engine.Fork(e.ctx, "team", "f1", ForkOptions{Tag: "default/private", Template: "counter"})
	wantCodeErr(t, err, connect.CodeFailedPrecondition, "tag default/private is not published")
	_, err = e.engine.Fork(e.ctx, "team", "f1", ForkOptions{Tag: "default/public"})
	wantCodeErr(t, err, connect.CodeInvalidArgument, "spec.template")
	_, err = e.engine.Fork(e.ctx, "team", "f1", ForkOptions{Tag: "default/public", Template: "other"})
	wantCodeErr(t, err, connect.CodeFailedPrecondition, "under other@1 loses state")

	f, err := e.engine.Fork(e.ctx, "team", "f1", ForkOptions{Tag: "default/public", Template: "counter"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.engine.Resume(e.ctx, "team", "f1", ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	r := e.agents["n1"].lastRestore()
	// Another space's revision of the same spec is the same guest.
	if r.GetScope() != torporv1.RestoreScope_RESTORE_SCOPE_FULL || r.GetSnapshot().GetLocation() != src.GetLocation() || r.GetWorkload().GetSpace() != "team" {
		t.Fatalf("cross-space fork restored %v", r)
	}
	if f.GetMetadata().GetSpace() != "team" || f.GetSpec().GetTemplate() != "counter" {
		t.Fatalf("fork %v", f)
	}
}

// applyIn applies template name with spec s in space.
func (e *env) applyIn(space, name string, s *torporv1.TemplateSpec) {
	e.t.Helper()
	err := e.store.InTx(e.ctx, func(tx store.Tx) error {
		_, _, err := ApplyTemplate(e.ctx, tx, &torporv1.ObjectMeta{Space: space, Name: name}, s)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// TestRevert: a RUNNING and a CRASHED actor go back to an older snapshot,
// newer state discarded, and their events say so.
func TestRevert(t *testing.T) {
	e := newEnv(t, 2, "n1")
	e.createActor("c1")
	old := e.cycle("c1")
	newer := e.cycle("c1")
	e.resume("c1", ResumeOptions{})

	a, err := e.engine.Revert(e.ctx, "default", "c1", old.GetMetadata().GetName())
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_RUNNING)
	if got := e.agents["n1"].lastRestore().GetSnapshot().GetLocation(); got != old.GetLocation() {
		t.Fatalf("revert restored %s, want %s", got, old.GetLocation())
	}
	if e.snapshotExists("default", newer.GetMetadata().GetName()) || !e.filesDeleted(newer.GetLocation()) {
		t.Fatal("the newer snapshot outlived the revert")
	}
	if e.agents["n1"].callCount("Terminate") == 0 {
		t.Fatal("the running workload was not stopped")
	}
	events := e.eventReasons("default", "c1")
	for _, want := range []string{"revert to snapshot " + old.GetMetadata().GetName() + " requested", "1 newer snapshots discarded: the running workload was stopped"} {
		if !strings.Contains(events, want) {
			t.Fatalf("events lack %q:\n%s", want, events)
		}
	}
	e.checkPlacement()

	// CRASHED: the crash and the state since the old snapshot go.
	e.suspend("c1")
	e.resume("c1", ResumeOptions{})
	w, err := e.store.Workers().Get(e.ctx, e.actor("c1").GetStatus().GetWorker().GetNamespace(), e.actor("c1").GetStatus().GetWorker().GetName())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.engine.CrashWorkerActor(e.ctx, w, "worker lost in test"); err != nil {
		t.Fatal(err)
	}
	wantState(t, e.actor("c1"), torporv1.ActorState_ACTOR_STATE_CRASHED)
	if a, err = e.engine.Revert(e.ctx, "default", "c1", old.GetMetadata().GetName()); err != nil {
		t.Fatal(err)
	}
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_RUNNING)
	if got := e.agents["n1"].lastRestore().GetSnapshot().GetLocation(); got != old.GetLocation() {
		t.Fatalf("revert of a crashed actor restored %s, want %s", got, old.GetLocation())
	}
	if !strings.Contains(e.eventReasons("default", "c1"), "revert to snapshot "+old.GetMetadata().GetName()+"; 1 newer snapshots discarded") {
		t.Fatalf("events:\n%s", e.eventReasons("default", "c1"))
	}
	e.checkPlacement()

	_, err = e.engine.Revert(e.ctx, "default", "c1", "s-nope")
	wantCodeErr(t, err, connect.CodeNotFound, "s-nope")
}

// TestRecoverFinishesARevert: a revert cut after its intent is finished by
// a new control plane: the workload stopped, the actor SUSPENDED at the
// snapshot.
func TestRecoverFinishesARevert(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	old := e.cycle("c1")
	e.cycle("c1")
	a := e.resume("c1", ResumeOptions{})
	if _, err := e.engine.claimDiscard(e.ctx, a, old); err != nil {
		t.Fatal(err)
	}
	wantState(t, e.actor("c1"), torporv1.ActorState_ACTOR_STATE_SUSPENDING)
	fresh := New(e.store, e.agents, e.objects, Options{HeartbeatTimeout: time.Minute}, slog.New(slog.DiscardHandler))
	if err := fresh.Recover(e.ctx, 0); err != nil {
		t.Fatal(err)
	}
	got := e.actor("c1")
	wantState(t, got, torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	if got.GetStatus().GetLatestSnapshot() != old.GetMetadata().GetName() || e.agents["n1"].slots["n1-w0"] != "" {
		t.Fatalf("after recovery: %v, worker runs %q", got.GetStatus(), e.agents["n1"].slots["n1-w0"])
	}
	e.checkPlacement()
}
