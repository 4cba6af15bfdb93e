package store_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// TestMigrateToRevisions: a store written before templates had revisions
// (schema step 3) opens with each template as its own revision 1 under the
// same uid, its actors on that revision and its snapshots indexed by it, so
// existing actors keep restoring FULL.
func TestMigrateToRevisions(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "torpor.db")
	st, err := store.Open(ctx, "sqlite:"+path)
	if err != nil {
		t.Fatal(err)
	}
	spec := &torporv1.TemplateSpec{SandboxClass: "gvisor", Containers: []*torporv1.Container{{Name: "main", Image: "img"}}}
	legacy, err := st.Templates().Create(ctx, &torporv1.Template{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "counter"}, Spec: spec,
		Status: &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_READY, GoldenSnapshot: "golden-1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	uid := legacy.GetMetadata().GetUid()
	if _, err := st.Actors().Create(ctx, &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "c1"}, Spec: &torporv1.ActorSpec{Template: "counter"},
		Status: &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED, LatestSnapshot: "s1"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Snapshots().Create(ctx, &torporv1.Snapshot{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "s1"}, TemplateUid: uid, TemplateName: "counter", Location: "default/a1/s1"}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	// Back to the schema of step 3, with the columns as it wrote them.
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		"DROP INDEX actors_sandbox",
		"ALTER TABLE actors DROP COLUMN sandbox",
		"DROP TABLE template_revisions",
		"DROP TABLE actor_activity",
		"DROP TABLE snapshot_tags",
		"DROP INDEX snapshots_location",
		"ALTER TABLE snapshots DROP COLUMN location",
		"DROP INDEX snapshots_template_uid",
		"ALTER TABLE snapshots DROP COLUMN template_uid",
		"UPDATE actors SET template = 'counter'",
		"DELETE FROM schema_migrations WHERE version >= 4",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	db.Close()

	st, err = store.Open(ctx, "sqlite:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rev, err := st.Revisions().Get(ctx, "default", "counter@1")
	if err != nil {
		t.Fatal(err)
	}
	if rev.GetMetadata().GetUid() != uid || !proto.Equal(rev.GetSpec(), spec) || rev.GetStatus().GetRevision() != 1 ||
		rev.GetStatus().GetPhase() != torporv1.TemplatePhase_TEMPLATE_PHASE_READY || rev.GetStatus().GetGoldenSnapshot() != "golden-1" {
		t.Fatalf("revision 1: %v", rev)
	}
	head, err := st.Templates().Get(ctx, "default", "counter")
	if err != nil {
		t.Fatal(err)
	}
	if head.GetStatus().GetLatestRevision() != 1 || head.GetSpec() != nil {
		t.Fatalf("template record: %v, want only the pointer to revision 1", head)
	}
	actors, _, err := st.Actors().List(ctx, store.ListOptions{Filter: store.Filter{"template": "counter@1"}})
	if err != nil || len(actors) != 1 || actors[0].GetSpec().GetTemplateRevision() != 1 {
		t.Fatalf("actors on counter@1: %v %v", actors, err)
	}
	snaps, _, err := st.Snapshots().List(ctx, store.ListOptions{Filter: store.Filter{"template_uid": uid}})
	if err != nil || len(snaps) != 1 {
		t.Fatalf("snapshots under counter@1: %v %v", snaps, err)
	}
	// Step 8 indexes E2B sandboxes: an actor made before is none.
	if sbx, _, err := st.Actors().List(ctx, store.ListOptions{Filter: store.Filter{"sandbox": "c1"}}); err != nil || len(sbx) != 0 {
		t.Fatalf("sandbox c1: %v %v, want none", sbx, err)
	}
	// Step 7 indexes the snapshots by location, which forks share.
	snaps, _, err = st.Snapshots().List(ctx, store.ListOptions{Filter: store.Filter{"location": "default/a1/s1"}})
	if err != nil || len(snaps) != 1 {
		t.Fatalf("snapshots at default/a1/s1: %v %v", snaps, err)
	}
}

// TestOpenNewerSchema: a binary opens a database that the next version
// migrated further (steps it does not know), as a replica of the previous
// version restarting during a rolling upgrade does, and works on it.
func TestOpenNewerSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "torpor.db")
	st, err := store.Open(ctx, "sqlite:"+path)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	// The next version's step: a table and a column this binary does not
	// know.
	for _, stmt := range []string{
		"CREATE TABLE next_version (a BIGINT)",
		"ALTER TABLE actors ADD COLUMN next_column TEXT NOT NULL DEFAULT ''",
		"INSERT INTO schema_migrations (version, name, applied_at) SELECT MAX(version) + 1, 'next', CURRENT_TIMESTAMP FROM schema_migrations",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	db.Close()

	st, err = store.Open(ctx, "sqlite:"+path)
	if err != nil {
		t.Fatalf("open a schema one step newer than this binary's: %v", err)
	}
	defer st.Close()
	if _, err := st.Actors().Create(ctx, &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "c1"}, Spec: &torporv1.ActorSpec{Template: "counter"},
	}); err != nil {
		t.Fatalf("create an actor on the newer schema: %v", err)
	}
}
