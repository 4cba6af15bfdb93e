// Package storetest makes fresh stores of both backends for other
// packages' tests: a SQLite file in a temporary directory, or a new
// schema of the PostgreSQL database in TORPOR_TEST_POSTGRES.
package storetest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Backends are the names URL accepts.
var Backends = []string{"sqlite", "postgres"}

const defaultPostgres = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL names a new, empty store of backend, removed when tb ends. Several
// store.Open calls on it share one database, as server replicas do. An
// unreachable PostgreSQL fails tb: CI always has one.
func URL(tb testing.TB, backend string) string {
	tb.Helper()
	switch backend {
	case "sqlite":
		return "sqlite:" + filepath.Join(tb.TempDir(), "torpor.db")
	case "postgres":
		return postgresSchemaURL(tb)
	}
	tb.Fatalf("storetest: unknown backend %q (want one of %v)", backend, Backends)
	return ""
}

func postgresSchemaURL(tb testing.TB) string {
	base := cmp.Or(os.Getenv("TORPOR_TEST_POSTGRES"), defaultPostgres)
	u, err := url.Parse(base)
	if err != nil {
		tb.Fatalf("TORPOR_TEST_POSTGRES: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		tb.Fatalf("PostgreSQL for tests (TORPOR_TEST_POSTGRES=%q) is unreachable: %v", base, err)
	}
	conn.Close(ctx)

	suffix := make([]byte, 6)
	rand.Read(suffix)
	schema := "storetest_" + hex.EncodeToString(suffix)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			tb.Errorf("drop test schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
