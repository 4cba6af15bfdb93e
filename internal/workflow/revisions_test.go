package workflow

import (
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// withData is template a's layout: one durable volume mounted at /data.
func withData() *torporv1.TemplateSpec {
	return spec("gvisor", []string{"data"}, map[string][]string{"main": {"data:/data"}})
}

// withoutData is a's layout with the volume removed.
func withoutData() *torporv1.TemplateSpec {
	return spec("gvisor", nil, map[string][]string{"main": nil})
}

func withEnv(s *torporv1.TemplateSpec, value string) *torporv1.TemplateSpec {
	s.Containers[0].Env = []*torporv1.EnvVar{{Name: "FLAVOUR", Value: value}}
	return s
}

// onRevision writes actor name's spec to revision rev of template
// directly, as a path that skips UpdateSpec would.
func (e *env) onRevision(name, template string, rev int64) {
	e.t.Helper()
	a := e.actor(name)
	a.Spec.Template, a.Spec.TemplateRevision = template, rev
	if _, err := e.store.Actors().Update(e.ctx, a); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) resumeErr(name string, opts ResumeOptions) error {
	_, err := e.engine.Resume(e.ctx, "default", name, opts)
	return err
}

func (e *env) reasons(name string) string {
	evs, err := e.store.Events(e.ctx, e.actor(name).GetMetadata().GetUid(), 0)
	if err != nil {
		e.t.Fatal(err)
	}
	var rs []string
	for _, ev := range evs {
		rs = append(rs, ev.Reason)
	}
	return strings.Join(rs, " | ")
}

// TestResumeChecksTheSnapshotsRevision: whatever path leads an actor to
// resume under another revision than its snapshot's, the claim checks the
// two specs and refuses a loss nobody accepted (invariant 7).
func TestResumeChecksTheSnapshotsRevision(t *testing.T) {
	t.Run("spec moved without UpdateSpec", func(t *testing.T) {
		e := repointEnv(t, torporv1.FromData_FROM_DATA_COLD_BOOT)
		e.createTemplateSpec("a", withoutData(), torporv1.FromData_FROM_DATA_COLD_BOOT) // a@2
		e.onRevision("c1", "a", 2)
		wantCodeErr(t, e.resumeErr("c1", ResumeOptions{}), connect.CodeFailedPrecondition, `volume "data" is missing`)
		if st := e.actor("c1").GetStatus(); st.GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED || st.GetWorker() != nil {
			t.Fatalf("a refused resume changed the actor: %v", st)
		}
		e.resume("c1", ResumeOptions{AllowStateLoss: true})
		if r := e.lastResumeReason("c1"); !strings.Contains(r, `state loss accepted: volume "data" is missing`) {
			t.Fatalf("the accepted loss is not in the history: %s", r)
		}
	})
	t.Run("template deleted and applied again", func(t *testing.T) {
		e := repointEnv(t, torporv1.FromData_FROM_DATA_COLD_BOOT)
		if err := e.store.Revisions().Delete(e.ctx, "default", "a@1", "", 0); err != nil {
			t.Fatal(err)
		}
		if err := e.store.Templates().Delete(e.ctx, "default", "a", "", 0); err != nil {
			t.Fatal(err)
		}
		again := e.createTemplateSpec("a", withoutData(), torporv1.FromData_FROM_DATA_COLD_BOOT)
		if again.GetStatus().GetRevision() != 1 {
			t.Fatalf("a applied again is revision %d", again.GetStatus().GetRevision())
		}
		wantCodeErr(t, e.resumeErr("c1", ResumeOptions{}), connect.CodeFailedPrecondition, `volume "data" is missing`)
	})
	t.Run("an older snapshot asked for", func(t *testing.T) {
		e := repointEnv(t, torporv1.FromData_FROM_DATA_COLD_BOOT)
		older := e.actor("c1").GetStatus().GetLatestSnapshot()
		wider := func() *torporv1.TemplateSpec {
			return spec("gvisor", []string{"data", "extra"}, map[string][]string{"main": {"data:/data", "extra:/extra"}})
		}
		e.createTemplateSpec("wider", wider(), torporv1.FromData_FROM_DATA_COLD_BOOT)
		if err := e.repoint("c1", "wider", true); err != nil {
			t.Fatal(err)
		}
		e.resume("c1", ResumeOptions{})
		e.suspend("c1")
		// A compatible move from the new snapshot; the loss accepted for
		// the older one under wider@1 does not carry over to wider@2.
		e.createTemplateSpec("wider", withEnv(wider(), "2"), torporv1.FromData_FROM_DATA_COLD_BOOT)
		if err := e.moveTo("c1", "wider", 2, false); err != nil {
			t.Fatal(err)
		}
		wantCodeErr(t, e.resumeErr("c1", ResumeOptions{Snapshot: older}), connect.CodeFailedPrecondition, `volume "extra" is new`)
		e.resume("c1", ResumeOptions{Snapshot: older, AllowStateLoss: true})
	})
	t.Run("a loss accepted by the move is accepted by its resume, once", func(t *testing.T) {
		e := repointEnv(t, torporv1.FromData_FROM_DATA_COLD_BOOT)
		e.createTemplateSpec("a", withoutData(), torporv1.FromData_FROM_DATA_COLD_BOOT)
		wantCodeErr(t, e.moveTo("c1", "a", 2, false), connect.CodeFailedPrecondition, `volume "data" is missing`)
		if got := e.actor("c1").GetSpec().GetTemplateRevision(); got != 1 {
			t.Fatalf("a refused move was written: revision %d", got)
		}
		if err := e.moveTo("c1", "a", 2, true); err != nil {
			t.Fatal(err)
		}
		if r := e.lastEventReason("c1"); !strings.Contains(r, "a@1 to a@2") || !strings.Contains(r, `state loss accepted: volume "data" is missing`) {
			t.Fatalf("the move's history: %s", r)
		}
		e.resume("c1", ResumeOptions{})
		if got := e.agents["n1"].lastRestore().GetScope(); got != torporv1.RestoreScope_RESTORE_SCOPE_DATA {
			t.Fatalf("restore after the move: %v, want DATA", got)
		}
		// The acceptance named that snapshot: a snapshot under a@2 needs
		// no check, and moving back to a@1 is checked afresh.
		e.suspend("c1")
		wantCodeErr(t, e.moveTo("c1", "a", 1, false), connect.CodeFailedPrecondition, `volume "data" is new`)
	})
}

func (e *env) moveTo(name, template string, rev int64, allowLoss bool) error {
	_, err := e.engine.UpdateSpec(e.ctx, "default", name, SpecUpdate{Template: template, Revision: rev, AllowStateLoss: allowLoss})
	return err
}

// lastResumeReason is the reason of the actor's latest RESUMING entry.
func (e *env) lastResumeReason(name string) string {
	evs, err := e.store.Events(e.ctx, e.actor(name).GetMetadata().GetUid(), 0)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].ToState == torporv1.ActorState_ACTOR_STATE_RESUMING {
			return evs[i].Reason
		}
	}
	return ""
}

// TestRollout: actors of older revisions move to the latest when they can;
// the rest stay, each with the reason.
func TestRollout(t *testing.T) {
	e := newEnv(t, 3, "n1")
	e.createTemplateSpec("a", withEnv(withData(), "1"), torporv1.FromData_FROM_DATA_COLD_BOOT)
	for _, name := range []string{"kept", "busy", "fresh"} {
		e.createActor(name)
		e.onRevision(name, "a", 1)
	}
	e.createActor("elsewhere") // on counter: no rollout of a touches it
	for _, name := range []string{"kept", "busy"} {
		e.resume(name, ResumeOptions{})
	}
	e.suspend("kept")

	rollout := func(allowLoss bool) map[string]RolloutResult {
		t.Helper()
		target, results, err := e.engine.Rollout(e.ctx, "default", "a", allowLoss)
		if err != nil {
			t.Fatal(err)
		}
		byActor := map[string]RolloutResult{}
		for _, r := range results {
			byActor[r.Actor] = r
		}
		for name, r := range byActor {
			on := e.actor(name).GetSpec().GetTemplateRevision()
			if r.Moved != (on == target.GetStatus().GetRevision()) {
				t.Fatalf("%s: reported moved=%v, but it is on revision %d", name, r.Moved, on)
			}
		}
		return byActor
	}

	// A compatible revision: the suspended actors move, the running one
	// cannot.
	e.createTemplateSpec("a", withEnv(withData(), "2"), torporv1.FromData_FROM_DATA_COLD_BOOT)
	got := rollout(false)
	if len(got) != 3 || !got["kept"].Moved || !got["fresh"].Moved || got["busy"].Moved {
		t.Fatalf("rollout to a@2: %+v", got)
	}
	if !strings.Contains(got["kept"].Message, "process memory will be discarded") || !strings.Contains(got["busy"].Message, "RUNNING") {
		t.Fatalf("rollout messages: %+v", got)
	}
	if e.actor("elsewhere").GetSpec().GetTemplate() != "counter" {
		t.Fatal("a rollout of a moved an actor of another template")
	}

	// A revision without the volume: the actor whose snapshot holds its
	// data cannot move without consent; the one without state can.
	e.createTemplateSpec("a", withEnv(withoutData(), "3"), torporv1.FromData_FROM_DATA_COLD_BOOT)
	e.suspend("busy")
	got = rollout(false)
	if len(got) != 3 || got["kept"].Moved || got["busy"].Moved || !got["fresh"].Moved {
		t.Fatalf("rollout to a@3: %+v", got)
	}
	for _, name := range []string{"kept", "busy"} {
		if !strings.Contains(got[name].Message, `volume "data" is missing`) || !strings.Contains(got[name].Message, "allow-state-loss") {
			t.Fatalf("%s: %q, want the volume named and how to accept", name, got[name].Message)
		}
	}
	got = rollout(true)
	if len(got) != 2 || !got["kept"].Moved || !got["busy"].Moved {
		t.Fatalf("rollout to a@3 accepting the loss: %+v", got)
	}
	if r := e.reasons("kept"); !strings.Contains(r, `state loss accepted: volume "data" is missing`) {
		t.Fatalf("the accepted loss is not in the history: %s", r)
	}
	e.resume("kept", ResumeOptions{})

	// Nothing moves to a revision whose golden build failed.
	e.createTemplateSpec("a", withEnv(withData(), "4"), torporv1.FromData_FROM_DATA_COLD_BOOT)
	r4 := e.revision("a@4")
	r4.Status = &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED, Message: "probe never passed", Revision: 4}
	if _, err := e.store.Revisions().Update(e.ctx, r4); err != nil {
		t.Fatal(err)
	}
	_, _, err := e.engine.Rollout(e.ctx, "default", "a", false)
	wantCodeErr(t, err, connect.CodeFailedPrecondition, "probe never passed")
}

// TestGoldenReadiness: an actor without state starts on a revision still
// building by a cold boot that says so, and not at all on a FAILED one.
func TestGoldenReadiness(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	e.resume("c1", ResumeOptions{})
	if r := e.lastResumeReason("c1"); !strings.Contains(r, "BOOT") || !strings.Contains(r, "golden snapshot of counter@1 is not ready (PENDING)") {
		t.Fatalf("resume before the golden is ready: %s", r)
	}
	e.createActor("c2")
	rev := e.revision("counter@1")
	rev.Status = &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED, Message: "command and args are both empty", Revision: 1}
	if _, err := e.store.Revisions().Update(e.ctx, rev); err != nil {
		t.Fatal(err)
	}
	wantCodeErr(t, e.resumeErr("c2", ResumeOptions{}), connect.CodeFailedPrecondition, "command and args are both empty")
}

// TestDeleteTemplateRemovesGoldenFiles: the golden snapshot of a deleted
// revision leaves the store and snapshot storage.
func TestDeleteTemplateRemovesGoldenFiles(t *testing.T) {
	e := newEnv(t, 1, "n1")
	if err := e.engine.BuildGoldens(e.ctx); err != nil {
		t.Fatal(err)
	}
	rev := e.revision("counter@1")
	golden := rev.GetStatus().GetGoldenSnapshot()
	if rev.GetStatus().GetPhase() != torporv1.TemplatePhase_TEMPLATE_PHASE_READY || golden == "" {
		t.Fatalf("golden build: %v", rev.GetStatus())
	}
	snap, err := e.store.Snapshots().Get(e.ctx, "default", golden)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.engine.DeleteTemplate(e.ctx, "default", "counter", 0, "", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Snapshots().Get(e.ctx, "default", golden); err == nil {
		t.Fatal("the golden snapshot record outlived its template")
	}
	if !slices.Contains(e.objects.deleted, snap.GetLocation()) {
		t.Fatalf("golden files at %s not removed (removed: %v)", snap.GetLocation(), e.objects.deleted)
	}
}

// TestPolicyRevisionKeepsMemory: a revision that changes only policies (an
// idle timeout) describes the same guest: an actor moved to it comes back
// FULL, memory and all, and nothing is reported discarded.
func TestPolicyRevisionKeepsMemory(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createTemplateSpec("a", withEnv(withData(), "1"), torporv1.FromData_FROM_DATA_COLD_BOOT)
	e.createActor("c1")
	e.onRevision("c1", "a", 1)
	e.resume("c1", ResumeOptions{})
	e.suspend("c1")

	idle := withEnv(withData(), "1")
	idle.IdlePolicy = &torporv1.IdlePolicy{IdleSeconds: 30, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND}
	e.createTemplateSpec("a", idle, torporv1.FromData_FROM_DATA_COLD_BOOT)
	if err := e.moveTo("c1", "a", 2, false); err != nil {
		t.Fatalf("move to a policy-only revision: %v", err)
	}
	e.resume("c1", ResumeOptions{})
	if got := e.agents["n1"].lastRestore().GetScope(); got != torporv1.RestoreScope_RESTORE_SCOPE_FULL {
		t.Fatalf("resume on a policy-only revision restored %v, want FULL", got)
	}
	if r := e.reasons("c1"); strings.Contains(r, "discarded") {
		t.Fatalf("a policy-only move reported memory discarded: %s", r)
	}
}
