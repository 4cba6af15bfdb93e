package server

import (
	"context"
	"io"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func (c clients) apply(t *testing.T, tmpl *torporv1.Template) *torporv1.Template {
	t.Helper()
	resp, err := c.templates.CreateTemplate(context.Background(), connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tmpl}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg
}

func (c clients) template(t *testing.T, ref string) *torporv1.Template {
	t.Helper()
	resp, err := c.templates.GetTemplate(context.Background(), connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: ref}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg
}

func (c clients) createActor(name, template string, rev int64) (*torporv1.Actor, error) {
	resp, err := c.actors.CreateActor(context.Background(), connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Name: name, Space: "default"}, Spec: &torporv1.ActorSpec{Template: template, TemplateRevision: rev},
	}}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (c clients) deleteTemplate(ref string) error {
	_, err := c.templates.DeleteTemplate(context.Background(), connect.NewRequest(&torporv1.DeleteRequest{Space: "default", Name: ref}))
	return err
}

// TestTemplateRevisions: an identical apply changes nothing, a changed one
// adds a revision with its own uid, and actors are created on (and stay on)
// the revision they name.
func TestTemplateRevisions(t *testing.T) {
	c := startServer(t, filepath.Join(t.TempDir(), "t.db"))
	ctx := context.Background()
	first := c.apply(t, counterTemplate("counter"))
	if st := first.GetStatus(); st.GetPhase() != torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING || st.GetRevision() != 1 || st.GetLatestRevision() != 1 {
		t.Fatalf("first apply: %v, want PENDING revision 1 of 1", st)
	}
	if got := first.GetSpec().GetSnapshotPolicy().GetKeep(); got != 2 {
		t.Errorf("default keep = %d, want 2", got)
	}
	again := c.apply(t, counterTemplate("counter"))
	if again.GetMetadata().GetUid() != first.GetMetadata().GetUid() || again.GetMetadata().GetVersion() != 1 || again.GetStatus().GetRevision() != 1 {
		t.Fatalf("identical re-apply changed the template: %v %v", again.GetMetadata(), again.GetStatus())
	}
	c1, err := c.createActor("c1", "counter", 0)
	if err != nil {
		t.Fatal(err)
	}
	if c1.GetSpec().GetTemplateRevision() != 1 {
		t.Fatalf("actor created on revision %d, want 1 (the latest)", c1.GetSpec().GetTemplateRevision())
	}

	changed := counterTemplate("counter")
	changed.Spec.Containers[0].Args = []string{"--verbose"}
	second := c.apply(t, changed)
	if second.GetMetadata().GetName() != "counter" || second.GetStatus().GetRevision() != 2 || second.GetMetadata().GetUid() == first.GetMetadata().GetUid() {
		t.Fatalf("changed apply: %v %v, want revision 2 of counter with a uid of its own", second.GetMetadata(), second.GetStatus())
	}
	if got := c.template(t, "counter"); got.GetStatus().GetRevision() != 2 || got.GetSpec().GetContainers()[0].GetArgs()[0] != "--verbose" {
		t.Fatalf("counter shows revision %d, want the latest (2)", got.GetStatus().GetRevision())
	}
	old := c.template(t, "counter@1")
	if old.GetStatus().GetRevision() != 1 || old.GetStatus().GetLatestRevision() != 2 || old.GetMetadata().GetUid() != first.GetMetadata().GetUid() {
		t.Fatalf("counter@1: %v %v", old.GetMetadata(), old.GetStatus())
	}
	list, err := c.templates.ListTemplates(ctx, connect.NewRequest(&torporv1.ListRequest{Space: "default"}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.Msg.GetTemplates()); n != 1 || list.Msg.GetTemplates()[0].GetStatus().GetRevision() != 2 {
		t.Fatalf("list shows %d templates (%v), want counter at revision 2", n, list.Msg.GetTemplates())
	}
	if a, err := c.actors.GetActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "c1"})); err != nil || a.Msg.GetSpec().GetTemplateRevision() != 1 {
		t.Fatalf("c1 after a new revision: %v %v, want it still on revision 1", a.Msg.GetSpec(), err)
	}
	if _, err := c.createActor("c2", "counter", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.createActor("c3", "counter", 1); err != nil {
		t.Fatal(err)
	}
	_, err = c.createActor("c4", "counter", 3)
	wantCode(t, err, connect.CodeFailedPrecondition, "counter@3")

	hist, err := c.templates.ListTemplateRevisions(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "counter"}))
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, r := range hist.Msg.GetRevisions() {
		got = append(got, r.GetTemplate().GetStatus().GetRevision(), r.GetActors())
	}
	if want := []int64{1, 2, 2, 1}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Fatalf("history (revision, actors...) = %v, want %v", got, want)
	}

	// An update to "counter" moves to the latest revision; one to the
	// revision the actor is on changes nothing.
	upd, err := c.actors.UpdateActor(ctx, connect.NewRequest(&torporv1.UpdateActorRequest{
		Actor:      &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "c1"}, Spec: &torporv1.ActorSpec{Template: "counter"}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.template"}},
	}))
	if err != nil || upd.Msg.GetSpec().GetTemplateRevision() != 2 {
		t.Fatalf("update --template counter: %v %v, want revision 2", upd.Msg.GetSpec(), err)
	}
}

// TestTemplateDeleteRules: nothing in use is deleted, the latest revision
// goes only with its template, and an unused template takes its golden
// snapshot record with it.
func TestTemplateDeleteRules(t *testing.T) {
	r := startReplica(t, "sqlite:"+filepath.Join(t.TempDir(), "t.db"), io.Discard)
	c := r.clients(r.admin(t))
	ctx := context.Background()
	c.apply(t, counterTemplate("counter"))
	changed := counterTemplate("counter")
	changed.Spec.Containers[0].Args = []string{"--verbose"}
	second := c.apply(t, changed)
	for _, name := range []string{"c1", "c2"} {
		if _, err := c.createActor(name, "counter", 1); err != nil {
			t.Fatal(err)
		}
	}
	wantCode(t, c.deleteTemplate("counter"), connect.CodeFailedPrecondition, "counter@1 is used by 2 actor(s) (c1, c2)")
	wantCode(t, c.deleteTemplate("counter@1"), connect.CodeFailedPrecondition, "counter@1 is used by 2 actor(s)")
	wantCode(t, c.deleteTemplate("counter@2"), connect.CodeFailedPrecondition, "latest revision")

	// A kept snapshot of an actor now on another template still holds
	// guest state built on revision 2.
	if _, err := r.store.Snapshots().Create(ctx, &torporv1.Snapshot{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "kept"}, ActorUid: "uid-other", ActorName: "other",
		TemplateUid: second.GetMetadata().GetUid(), TemplateName: "counter@2", Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Location: "default/uid-other/kept",
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"c1", "c2"} {
		if _, err := c.actors.DeleteActor(ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: "default", Name: name})); err != nil {
			t.Fatal(err)
		}
	}
	wantCode(t, c.deleteTemplate("counter"), connect.CodeFailedPrecondition, "counter@2 is used by 1 snapshot(s) of actor(s) other")
	if err := c.deleteTemplate("counter@1"); err != nil {
		t.Fatalf("delete of an unused older revision: %v", err)
	}
	if _, err := c.templates.GetTemplate(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "counter@1"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("counter@1 after its delete: %v, want NotFound", err)
	}
	if err := r.store.Snapshots().Delete(ctx, "default", "kept", "", 0); err != nil {
		t.Fatal(err)
	}

	// Revision 2's golden snapshot goes with it.
	rev, err := r.store.Revisions().Get(ctx, "default", "counter@2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.Snapshots().Create(ctx, &torporv1.Snapshot{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "golden-2"}, ActorUid: rev.GetMetadata().GetUid(),
		TemplateUid: rev.GetMetadata().GetUid(), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Location: "default/" + rev.GetMetadata().GetUid() + "/golden-2",
	}); err != nil {
		t.Fatal(err)
	}
	rev.Status = &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_READY, GoldenSnapshot: "golden-2", Revision: 2}
	if _, err := r.store.Revisions().Update(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if err := c.deleteTemplate("counter"); err != nil {
		t.Fatalf("delete of an unused template: %v", err)
	}
	for _, check := range []error{
		func() error { _, err := r.store.Snapshots().Get(ctx, "default", "golden-2"); return err }(),
		func() error { _, err := r.store.Revisions().Get(ctx, "default", "counter@2"); return err }(),
		func() error { _, err := r.store.Templates().Get(ctx, "default", "counter"); return err }(),
	} {
		if !isNotFound(check) {
			t.Fatalf("a record of the deleted template is left: %v", check)
		}
	}
	// The name starts afresh.
	if again := c.apply(t, counterTemplate("counter")); again.GetStatus().GetRevision() != 1 {
		t.Fatalf("a template applied again after its delete starts at revision %d, want 1", again.GetStatus().GetRevision())
	}
}

// TestFailedRevision: no actor is created on a revision whose golden build
// failed; a rebuild sends it back to PENDING, and only a FAILED one.
func TestFailedRevision(t *testing.T) {
	r := startReplica(t, "sqlite:"+filepath.Join(t.TempDir(), "t.db"), io.Discard)
	c := r.clients(r.admin(t))
	ctx := context.Background()
	c.apply(t, counterTemplate("counter"))
	setPhase := func(phase torporv1.TemplatePhase, msg string) {
		t.Helper()
		rev, err := r.store.Revisions().Get(ctx, "default", "counter@1")
		if err != nil {
			t.Fatal(err)
		}
		rev.Status = &torporv1.TemplateStatus{Phase: phase, Message: msg, Revision: 1}
		if _, err := r.store.Revisions().Update(ctx, rev); err != nil {
			t.Fatal(err)
		}
	}
	setPhase(torporv1.TemplatePhase_TEMPLATE_PHASE_BUILDING, "booting")
	if _, err := c.createActor("early", "counter", 0); err != nil {
		t.Fatalf("create on a BUILDING revision: %v, want it accepted", err)
	}
	_, err := c.templates.RebuildTemplate(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "counter"}))
	wantCode(t, err, connect.CodeFailedPrecondition, "only a FAILED golden build is rebuilt")

	setPhase(torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED, "command and args are both empty")
	_, err = c.createActor("late", "counter", 0)
	wantCode(t, err, connect.CodeFailedPrecondition, "command and args are both empty")

	rebuilt, err := c.templates.RebuildTemplate(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "counter@1"}))
	if err != nil {
		t.Fatal(err)
	}
	if rebuilt.Msg.GetStatus().GetPhase() != torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING {
		t.Fatalf("rebuilt: %v, want PENDING", rebuilt.Msg.GetStatus())
	}
	if _, err := c.createActor("late", "counter", 0); err != nil {
		t.Fatalf("create once the rebuild is pending: %v", err)
	}
}
