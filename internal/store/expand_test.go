package store

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// expandStatement is what a step from firstExpandOnly on may do: create a
// table or an index, or add a column that is nullable or has a default
// (rows the previous version inserts, naming only its columns, get it).
var expandStatement = regexp.MustCompile(`(?is)^(CREATE TABLE\s|CREATE (UNIQUE )?INDEX\s|ALTER TABLE \w+ ADD COLUMN \w+ (\{\{\w+\}\}|\w+)( NULL)?( NOT NULL)? DEFAULT\s|ALTER TABLE \w+ ADD COLUMN \w+ (\{\{\w+\}\}|\w+)\s*$)`)

// TestMigrationsExpandOnly fails a step from firstExpandOnly on that drops,
// renames, rewrites or constrains what the previous version's binary reads
// and writes: during a rolling upgrade that binary runs on the migrated
// schema (docs/operations.md, "Upgrades"). A step in Go rewrites records,
// so none is allowed.
func TestMigrationsExpandOnly(t *testing.T) {
	steps, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range codeMigrations {
		if m.version >= firstExpandOnly {
			t.Errorf("step %d (%s) is Go code: from step %d on a step only adds, in SQL", m.version, m.name, firstExpandOnly)
		}
	}
	checked := 0
	for _, m := range steps[firstExpandOnly-1:] {
		body, err := migrationFiles.ReadFile(migrationFile(m))
		if err != nil {
			continue // a code step, reported above
		}
		for _, stmt := range statements(string(body)) {
			if !expandStatement.MatchString(stmt) {
				t.Errorf("step %d (%s): %q does not only add (a table, an index, a nullable or defaulted column)", m.version, m.name, stmt)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatalf("no statement of steps %d..%d read", firstExpandOnly, len(steps))
	}
}

// TestExpandStatement: the rule tells additions from the rest.
func TestExpandStatement(t *testing.T) {
	for stmt, want := range map[string]bool{
		"CREATE TABLE t (a BIGINT)":                                          true,
		"CREATE UNIQUE INDEX i ON t (a) WHERE a <> ''":                       true,
		"ALTER TABLE actors ADD COLUMN sandbox {{text}} NOT NULL DEFAULT ''": true,
		"ALTER TABLE actors ADD COLUMN note {{text}}":                        true,
		"ALTER TABLE actors ADD COLUMN note {{text}} NOT NULL":               false,
		"ALTER TABLE actors DROP COLUMN sandbox":                             false,
		"ALTER TABLE actors RENAME COLUMN a TO b":                            false,
		"DROP TABLE actor_activity":                                          false,
		"UPDATE actors SET template = ''":                                    false,
		"DROP INDEX actors_sandbox":                                          false,
	} {
		if got := expandStatement.MatchString(stmt); got != want {
			t.Errorf("%q: expand-only %v, want %v", stmt, got, want)
		}
	}
}

// migrationFile is the embedded file of step m.
func migrationFile(m migration) string {
	return fmt.Sprintf("migrations/%04d_%s.sql", m.version, m.name)
}

// statements splits a step's SQL into its statements, without comments.
func statements(sql string) []string {
	var lines []string
	for _, l := range strings.Split(sql, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			lines = append(lines, l)
		}
	}
	var out []string
	for _, s := range strings.Split(strings.Join(lines, "\n"), ";") {
		if s = strings.Join(strings.Fields(s), " "); s != "" {
			out = append(out, s)
		}
	}
	return out
}
