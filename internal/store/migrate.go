package store

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/validate"
)

// DefaultSpace exists in every store from its first Open.
const DefaultSpace = "default"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one schema step. Steps are numbered from 1 without gaps and
// never edited once released; a change is a new step. From step
// firstExpandOnly on, a step only adds (tables, indexes, columns with a
// default: TestMigrationsExpandOnly), so the previous version's binary
// runs on the schema the next one migrated, as a rolling upgrade needs.
type migration struct {
	version int
	name    string
	apply   func(ctx context.Context, tx *sql.Tx, d *dialect) error
}

// firstExpandOnly is the first step released under the expand-only rule.
const firstExpandOnly = 8

// codeMigrations are steps that need Go (records hold serialized protobuf).
var codeMigrations = []migration{
	{version: 2, name: "default_space", apply: createDefaultSpace},
	{version: 5, name: "first_revisions", apply: firstRevisions},
	{version: 7, name: "snapshot_tags", apply: snapshotTags},
}

func createDefaultSpace(ctx context.Context, tx *sql.Tx, _ *dialect) error {
	_, err := newView(executor{read: tx, write: tx}).Spaces().Create(ctx, &torporv1.Space{
		Metadata: &torporv1.ObjectMeta{Name: DefaultSpace},
	})
	return err
}

// firstRevisions makes each existing template its own revision 1, under
// the template's uid, so the snapshots and actors built on it stay on it;
// the template record keeps only the pointer to its latest revision. Actors
// name revision 1, and every record is written again so that the indexed
// columns of step 4 hold their values.
func firstRevisions(ctx context.Context, tx *sql.Tx, _ *dialect) error {
	v := newView(executor{read: tx, write: tx})
	err := rewriteAll(ctx, v.Templates(), func(t *torporv1.Template) error {
		m := t.GetMetadata()
		st := t.GetStatus()
		if _, err := v.Revisions().Create(ctx, &torporv1.Template{
			Metadata: &torporv1.ObjectMeta{Space: m.GetSpace(), Name: validate.RevisionName(m.GetName(), 1), Uid: m.GetUid(), Labels: m.GetLabels()},
			Spec:     t.GetSpec(),
			Status:   &torporv1.TemplateStatus{Phase: st.GetPhase(), Message: st.GetMessage(), GoldenSnapshot: st.GetGoldenSnapshot(), Revision: 1},
		}); err != nil {
			return err
		}
		t.Spec = nil
		t.Status = &torporv1.TemplateStatus{LatestRevision: 1}
		return nil
	})
	if err != nil {
		return err
	}
	// The actors' records and their template column only: the actor kind
	// has columns of later steps, which do not exist yet.
	err = rewriteData(ctx, tx, v.Actors(), "template", func(a *torporv1.Actor) string {
		if a.GetSpec().GetTemplateRevision() == 0 {
			a.Spec.TemplateRevision = 1
		}
		return validate.RevisionName(a.GetSpec().GetTemplate(), a.GetSpec().GetTemplateRevision())
	})
	if err != nil {
		return err
	}
	// Only the column this step added is written: the snapshot kind has
	// columns of later steps, which do not exist yet.
	return setColumn(ctx, tx, v.Snapshots(), "template_uid", (*torporv1.Snapshot).GetTemplateUid)
}

// setColumn fills one indexed column of c's table from each record.
func setColumn[T Object](ctx context.Context, tx *sql.Tx, c Collection[T], column string, value func(T) string) error {
	table := c.(*collection[T]).kind.table
	for obj, err := range All(ctx, c, ListOptions{}) {
		if err != nil {
			return err
		}
		m := obj.GetMetadata()
		if _, err := tx.ExecContext(ctx, "UPDATE "+table+" SET "+column+" = $1 WHERE space = $2 AND name = $3", value(obj), m.GetSpace(), m.GetName()); err != nil {
			return fmt.Errorf("%s %s/%s: set %s: %w", table, m.GetSpace(), m.GetName(), column, err)
		}
	}
	return nil
}

// rewriteData applies change to every record of c and writes back its
// data and the one indexed column change returns the value of, and no
// other column. Writes go in (space, name) order behind the page token.
func rewriteData[T Object](ctx context.Context, tx *sql.Tx, c Collection[T], column string, change func(T) string) error {
	table := c.(*collection[T]).kind.table
	for obj, err := range All(ctx, c, ListOptions{}) {
		if err != nil {
			return err
		}
		value := change(obj)
		m := obj.GetMetadata()
		data, err := marshalOptions.Marshal(obj)
		if err != nil {
			return fmt.Errorf("%s %s/%s: encode: %w", table, m.GetSpace(), m.GetName(), err)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+table+" SET data = $1, "+column+" = $2 WHERE space = $3 AND name = $4", data, value, m.GetSpace(), m.GetName()); err != nil {
			return fmt.Errorf("%s %s/%s: rewrite: %w", table, m.GetSpace(), m.GetName(), err)
		}
	}
	return nil
}

// snapshotTagsDDL: snapshot tags (SnapshotTag, indexed by the snapshot
// they name), and snapshots indexed by location, which forks share.
const snapshotTagsDDL = `
CREATE TABLE snapshot_tags (
    space       {{text}} NOT NULL,
    name        {{text}} NOT NULL,
    uid         {{text}} NOT NULL UNIQUE,
    version     BIGINT NOT NULL,
    create_time {{time}} NOT NULL,
    update_time {{time}} NOT NULL,
    data        {{bytes}} NOT NULL,
    snapshot    {{text}} NOT NULL,
    PRIMARY KEY (space, name)
);
CREATE INDEX snapshot_tags_snapshot ON snapshot_tags (snapshot, space, name);

ALTER TABLE snapshots ADD COLUMN location {{text}} NOT NULL DEFAULT '';
CREATE INDEX snapshots_location ON snapshots (location, space, name);
`

// snapshotTags adds tags and indexes existing snapshots by location.
func snapshotTags(ctx context.Context, tx *sql.Tx, d *dialect) error {
	if _, err := tx.ExecContext(ctx, d.ddl.Replace(snapshotTagsDDL)); err != nil {
		return err
	}
	return setColumn(ctx, tx, newView(executor{read: tx, write: tx}).Snapshots(), "location", (*torporv1.Snapshot).GetLocation)
}

// rewriteAll applies change to every record of c and writes it back.
// Writes go in (space, name) order behind the page token, so paging is
// not disturbed by them.
func rewriteAll[T Object](ctx context.Context, c Collection[T], change func(T) error) error {
	for obj, err := range All(ctx, c, ListOptions{}) {
		if err != nil {
			return err
		}
		if err := change(obj); err != nil {
			return err
		}
		if _, err := c.Update(ctx, obj); err != nil {
			return err
		}
	}
	return nil
}

// migrations lists every step in order, from the embedded SQL files
// (NNNN_name.sql) and codeMigrations.
func migrations() ([]migration, error) {
	files, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	all := slices.Clone(codeMigrations)
	for _, file := range files {
		base := strings.TrimSuffix(path.Base(file), ".sql")
		num, name, _ := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migration file %s: name must start with its number", file)
		}
		body, err := migrationFiles.ReadFile(file)
		if err != nil {
			return nil, err
		}
		all = append(all, migration{version: version, name: name, apply: func(ctx context.Context, tx *sql.Tx, d *dialect) error {
			_, err := tx.ExecContext(ctx, d.ddl.Replace(string(body)))
			return err
		}})
	}
	slices.SortFunc(all, func(a, b migration) int { return a.version - b.version })
	for i, m := range all {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: number %d, want %d (steps must be numbered 1, 2, ... without gaps)", m.name, m.version, i+1)
		}
	}
	return all, nil
}

// migrate applies the missing steps in one transaction. Concurrent Opens
// of one database wait for each other (SQLite: the write lock of BEGIN
// IMMEDIATE; PostgreSQL: an advisory lock) and the later ones find nothing
// left to do.
func (s *sqlStore) migrate(ctx context.Context) error {
	steps, err := migrations()
	if err != nil {
		return err
	}
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	for _, stmt := range s.dialect.migrationPrelude {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("migrate: %s: %w", stmt, err)
		}
	}
	create := s.dialect.ddl.Replace(`CREATE TABLE IF NOT EXISTS schema_migrations (
		version    BIGINT PRIMARY KEY,
		name       {{text}} NOT NULL,
		applied_at {{time}} NOT NULL)`)
	if _, err := tx.ExecContext(ctx, create); err != nil {
		return fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	var current int
	if err := tx.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations").Scan(&current); err != nil {
		return fmt.Errorf("migrate: read schema version: %w", err)
	}
	// A schema newer than this binary's is the next version's, migrated
	// by one of its replicas during a rolling upgrade: its steps only add
	// (expandOnly), so this binary works on it and may still restart.
	for _, m := range steps[min(current, len(steps)):] {
		if err := m.apply(ctx, tx, s.dialect); err != nil {
			return fmt.Errorf("migrate: step %d (%s): %w", m.version, m.name, err)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
			m.version, m.name, now()); err != nil {
			return fmt.Errorf("migrate: record step %d: %w", m.version, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
	}
	return nil
}

// now is the store's clock: UTC, microseconds (what both databases keep).
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }
