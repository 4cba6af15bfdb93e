package workflow

import (
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

func spec(class string, volumes []string, containers map[string][]string) *torporv1.TemplateSpec {
	s := &torporv1.TemplateSpec{SandboxClass: class}
	for _, v := range volumes {
		s.Volumes = append(s.Volumes, &torporv1.Volume{Name: v, Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE})
	}
	for name, mounts := range containers {
		c := &torporv1.Container{Name: name, Image: "img"}
		for _, m := range mounts {
			vol, path, _ := strings.Cut(m, ":")
			c.Mounts = append(c.Mounts, &torporv1.Mount{Volume: vol, Path: path})
		}
		s.Containers = append(s.Containers, c)
	}
	return s
}

func TestCheckRepoint(t *testing.T) {
	base := spec("gvisor", []string{"data", "cache"}, map[string][]string{"main": {"data:/data", "cache:/cache"}})
	tests := []struct {
		name    string
		next    *torporv1.TemplateSpec
		wantErr string
	}{
		{"identical", base, ""},
		{"volumes and mounts in another order", spec("gvisor", []string{"cache", "data"}, map[string][]string{"main": {"cache:/cache", "data:/data"}}), ""},
		{"container added", spec("gvisor", []string{"data", "cache"}, map[string][]string{"main": {"data:/data", "cache:/cache"}, "side": {"data:/x"}}), ""},
		{"container removed", spec("gvisor", []string{"data", "cache"}, map[string][]string{"other": {"data:/data", "cache:/cache"}}), ""},
		{"sandbox class", spec("microvm", []string{"data", "cache"}, map[string][]string{"main": {"data:/data", "cache:/cache"}}), `sandbox class "microvm"`},
		{"volume missing", spec("gvisor", []string{"data"}, map[string][]string{"main": {"data:/data"}}), `volume "cache" is missing`},
		{"volume new", spec("gvisor", []string{"data", "cache", "more"}, map[string][]string{"main": {"data:/data", "cache:/cache", "more:/more"}}), `volume "more" is new`},
		{"mount moved", spec("gvisor", []string{"data", "cache"}, map[string][]string{"main": {"data:/other", "cache:/cache"}}), `container "main" mounts`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckRepoint(base, tt.next)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to mention %s", err, tt.wantErr)
			}
		})
	}
}

// repointEnv has templates a, b (same layout as a) on one node, and an
// actor c1 suspended once under a.
func repointEnv(t *testing.T, bFromData torporv1.FromData) *env {
	e := newEnv(t, 2, "n1")
	e.createTemplateSpec("a", spec("gvisor", []string{"data"}, map[string][]string{"main": {"data:/data"}}), torporv1.FromData_FROM_DATA_COLD_BOOT)
	// b runs another program over the same layout: a's memory cannot
	// come back under it.
	e.createTemplateSpec("b", withEnv(spec("gvisor", []string{"data"}, map[string][]string{"main": {"data:/data"}}), "b"), bFromData)
	a := e.createActor("c1")
	a.Spec.Template, a.Spec.TemplateRevision = "a", 1
	if _, err := e.store.Actors().Update(e.ctx, a); err != nil {
		t.Fatal(err)
	}
	e.resume("c1", ResumeOptions{})
	e.suspend("c1")
	return e
}

func (e *env) createTemplateSpec(name string, s *torporv1.TemplateSpec, fromData torporv1.FromData) *torporv1.Template {
	s = proto.Clone(s).(*torporv1.TemplateSpec)
	s.SnapshotPolicy = &torporv1.SnapshotPolicy{
		OnPause: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, OnCommit: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		OnResume: &torporv1.OnResume{FromData: fromData}, Keep: 2,
	}
	var tmpl *torporv1.Template
	err := e.store.InTx(e.ctx, func(tx store.Tx) error {
		var err error
		tmpl, _, err = ApplyTemplate(e.ctx, tx, &torporv1.ObjectMeta{Space: "default", Name: name}, s)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return tmpl
}

func (e *env) resume(name string, opts ResumeOptions) *torporv1.Actor {
	e.t.Helper()
	a, err := e.engine.Resume(e.ctx, "default", name, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

func (e *env) suspend(name string) *torporv1.Actor {
	e.t.Helper()
	a, err := e.engine.Suspend(e.ctx, "default", name)
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

func (e *env) repoint(name, template string, allowLoss bool) error {
	_, err := e.engine.UpdateSpec(e.ctx, "default", name, SpecUpdate{Template: template, AllowStateLoss: allowLoss})
	return err
}

func (e *env) lastEventReason(name string) string {
	evs, err := e.store.Events(e.ctx, e.actor(name).GetMetadata().GetUid(), 0)
	if err != nil || len(evs) == 0 {
		e.t.Fatalf("events: %v", err)
	}
	return evs[len(evs)-1].Reason
}

func wantCodeErr(t *testing.T, err error, code connect.Code, part string) {
	t.Helper()
	if errdefs.Code(err) != code || !strings.Contains(err.Error(), part) {
		t.Fatalf("err = %v, want %v mentioning %q", err, code, part)
	}
}

func TestRepointWithoutDurableDataNeedsConsent(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.agents["n1"].noData = true
	e.createTemplateSpec("a", spec("gvisor", nil, map[string][]string{"main": nil}), torporv1.FromData_FROM_DATA_COLD_BOOT)
	e.createTemplateSpec("b", withEnv(spec("gvisor", nil, map[string][]string{"main": nil}), "b"), torporv1.FromData_FROM_DATA_COLD_BOOT)
	a := e.createActor("c1")
	a.Spec.Template, a.Spec.TemplateRevision = "a", 1
	if _, err := e.store.Actors().Update(e.ctx, a); err != nil {
		t.Fatal(err)
	}
	e.resume("c1", ResumeOptions{})
	e.suspend("c1")

	wantCodeErr(t, e.repoint("c1", "b", false), connect.CodeFailedPrecondition, "allow-state-loss")
	if e.actor("c1").GetSpec().GetTemplate() != "a" {
		t.Fatal("a refused repoint was written")
	}
	if err := e.repoint("c1", "b", true); err != nil {
		t.Fatal(err)
	}
	if r := e.lastEventReason("c1"); !strings.Contains(r, "all state discarded") {
		t.Fatalf("history does not say state was discarded: %q", r)
	}
	e.resume("c1", ResumeOptions{})
	if got := e.agents["n1"].lastRestore().GetScope(); got != torporv1.RestoreScope_RESTORE_SCOPE_DATA {
		t.Fatalf("resume after a repoint is %v, want DATA (a boot with no data)", got)
	}
	if r := e.lastEventReason("c1"); !strings.Contains(r, "resumed") {
		t.Fatalf("last event %q", r)
	}
}

func TestRepointOntoGoldenTemplate(t *testing.T) {
	e := repointEnv(t, torporv1.FromData_FROM_DATA_GOLDEN)
	b := e.revision("b@1")
	b.Status = &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_READY, GoldenSnapshot: "golden-b", Revision: 1}
	if _, err := e.store.Revisions().Update(e.ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Snapshots().Create(e.ctx, &torporv1.Snapshot{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "golden-b"}, ActorUid: b.GetMetadata().GetUid(), TemplateUid: b.GetMetadata().GetUid(), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Location: "default/b/golden-b"}); err != nil {
		t.Fatal(err)
	}
	if err := e.repoint("c1", "b", false); err != nil {
		t.Fatal(err)
	}
	r := e.resume("c1", ResumeOptions{})
	req := e.agents["n1"].lastRestore()
	if req.GetScope() != torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN || req.GetGolden().GetLocation() != "default/b/golden-b" || req.GetSnapshot() == nil {
		t.Fatalf("restore = %v, want DATA_ON_GOLDEN on b's golden with the actor's data", req)
	}
	if r.GetStatus().GetCurrentTemplateUid() != b.GetMetadata().GetUid() {
		t.Fatal("status does not record the template the guest now runs")
	}
	s := e.suspend("c1")
	snap, _ := e.store.Snapshots().Get(e.ctx, "default", s.GetStatus().GetLatestSnapshot())
	if snap.GetTemplateUid() != b.GetMetadata().GetUid() {
		t.Fatal("the next snapshot does not record the template the guest runs")
	}
}

func TestRepointedThenPausedRestoresFull(t *testing.T) {
	e := repointEnv(t, torporv1.FromData_FROM_DATA_COLD_BOOT)
	if err := e.repoint("c1", "b", false); err != nil {
		t.Fatal(err)
	}
	e.resume("c1", ResumeOptions{})
	if got := e.agents["n1"].lastRestore().GetScope(); got != torporv1.RestoreScope_RESTORE_SCOPE_DATA {
		t.Fatalf("first resume after repoint: %v, want DATA", got)
	}
	if _, err := e.engine.Pause(e.ctx, "default", "c1"); err != nil {
		t.Fatal(err)
	}
	e.resume("c1", ResumeOptions{})
	req := e.agents["n1"].lastRestore()
	if req.GetScope() != torporv1.RestoreScope_RESTORE_SCOPE_FULL || req.GetSnapshot().GetNode() != "n1" {
		t.Fatalf("resume from the pause: %v, want FULL from the local checkpoint", req)
	}
}

func TestRepointRacingResume(t *testing.T) {
	t.Run("repoint lands before the claim: the resume starts over under the new template", func(t *testing.T) {
		e := repointEnv(t, torporv1.FromData_FROM_DATA_COLD_BOOT)
		once := false
		e.engine.SetHooks(Hooks{BeforeResumeClaim: func(*torporv1.Actor) {
			if once {
				return
			}
			once = true
			if err := e.repoint("c1", "b", false); err != nil {
				t.Error(err)
			}
		}})
		r := e.resume("c1", ResumeOptions{})
		b := e.revision("b@1")
		if got := e.agents["n1"].lastRestore().GetScope(); got != torporv1.RestoreScope_RESTORE_SCOPE_DATA {
			t.Fatalf("old guest memory restored under the new template: scope %v", got)
		}
		if r.GetStatus().GetCurrentTemplateUid() != b.GetMetadata().GetUid() {
			t.Fatal("status does not record the new template")
		}
		e.engine.SetHooks(Hooks{})
		s := e.suspend("c1")
		snap, _ := e.store.Snapshots().Get(e.ctx, "default", s.GetStatus().GetLatestSnapshot())
		if snap.GetTemplateUid() != b.GetMetadata().GetUid() {
			t.Fatal("the next snapshot does not record the template the guest really runs")
		}
	})
	t.Run("repoint after the claim is refused", func(t *testing.T) {
		e := repointEnv(t, torporv1.FromData_FROM_DATA_COLD_BOOT)
		var repointErr error
		e.engine.SetHooks(Hooks{AfterResumeClaim: func(*torporv1.Actor) { repointErr = e.repoint("c1", "b", false) }})
		r := e.resume("c1", ResumeOptions{})
		wantCodeErr(t, repointErr, connect.CodeFailedPrecondition, "RESUMING")
		if got := e.agents["n1"].lastRestore().GetScope(); got != torporv1.RestoreScope_RESTORE_SCOPE_FULL || r.GetSpec().GetTemplate() != "a" {
			t.Fatalf("resume under the old template: scope %v template %s", got, r.GetSpec().GetTemplate())
		}
	})
}

func TestRepointChecksTheSnapshotsTemplate(t *testing.T) {
	t.Run("old template deleted", func(t *testing.T) {
		e := repointEnv(t, torporv1.FromData_FROM_DATA_COLD_BOOT)
		// Behind the API's back (templates in use cannot be deleted): the
		// records of a template deleted before that rule existed.
		if err := e.store.Revisions().Delete(e.ctx, "default", "a@1", "", 0); err != nil {
			t.Fatal(err)
		}
		if err := e.store.Templates().Delete(e.ctx, "default", "a", "", 0); err != nil {
			t.Fatal(err)
		}
		e.createTemplateSpec("moved", spec("gvisor", []string{"data"}, map[string][]string{"main": {"data:/elsewhere"}}), torporv1.FromData_FROM_DATA_COLD_BOOT)
		wantCodeErr(t, e.repoint("c1", "moved", false), connect.CodeFailedPrecondition, `container "main" mounts`)
		if err := e.repoint("c1", "b", false); err != nil {
			t.Fatalf("a compatible repoint after the old template's deletion: %v", err)
		}
	})
	t.Run("chained repoints", func(t *testing.T) {
		e := repointEnv(t, torporv1.FromData_FROM_DATA_COLD_BOOT)
		e.createTemplateSpec("dropped", spec("gvisor", []string{"data"}, map[string][]string{"other": {"data:/data"}}), torporv1.FromData_FROM_DATA_COLD_BOOT)
		e.createTemplateSpec("back", spec("gvisor", []string{"data"}, map[string][]string{"main": {"data:/other"}, "other": {"data:/data"}}), torporv1.FromData_FROM_DATA_COLD_BOOT)
		if err := e.repoint("c1", "dropped", false); err != nil {
			t.Fatal(err)
		}
		wantCodeErr(t, e.repoint("c1", "back", false), connect.CodeFailedPrecondition, `container "main" mounts`)
	})
	t.Run("only while suspended or crashed", func(t *testing.T) {
		e := repointEnv(t, torporv1.FromData_FROM_DATA_COLD_BOOT)
		e.resume("c1", ResumeOptions{})
		wantCodeErr(t, e.repoint("c1", "b", false), connect.CodeFailedPrecondition, "RUNNING")
		wantCodeErr(t, e.repoint("c1", "nope", false), connect.CodeFailedPrecondition, "RUNNING")
	})
}
