package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"
)

// Open connects to the store named by storeURL and applies pending migrations.
//
//	sqlite:/var/lib/torpor/torpor.db      a file (created if absent)
//	postgres://user@host:5432/db?sslmode=disable&search_path=torpor
//
// For PostgreSQL, the first schema of search_path is created if missing, so
// several installations (or tests) can share one database.
func Open(ctx context.Context, storeURL string) (Store, error) {
	scheme, rest, _ := strings.Cut(storeURL, ":")
	switch scheme {
	case "sqlite":
		return openSQLite(ctx, rest)
	case "postgres", "postgresql":
		return openPostgres(ctx, storeURL)
	}
	return nil, fmt.Errorf("store url: unknown scheme %q (want sqlite:PATH or postgres://...)", scheme)
}

// dialect is everything the two backends do differently; all queries are
// shared ($N placeholders work on both).
type dialect struct {
	// ddl fills the type placeholders of the shared migration SQL.
	ddl *strings.Replacer
	// migrationPrelude runs first inside the migration transaction.
	migrationPrelude []string
}

var sqliteDialect = &dialect{
	ddl: strings.NewReplacer(
		"{{text}}", "TEXT",
		"{{bytes}}", "BLOB",
		"{{time}}", "TIMESTAMP",
		"{{serial}}", "INTEGER PRIMARY KEY",
	),
}

// postgresMigrationLock is the advisory lock key that serializes migrations
// of concurrently starting servers ("torpor" in ASCII).
const postgresMigrationLock = 0x746f72706f72

func postgresDialect(schema string) *dialect {
	d := &dialect{
		ddl: strings.NewReplacer(
			// Byte order, not the database locale, so both backends list
			// in the same order.
			"{{text}}", `TEXT COLLATE "C"`,
			"{{bytes}}", "BYTEA",
			"{{time}}", "TIMESTAMPTZ",
			"{{serial}}", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
		),
		migrationPrelude: []string{fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", postgresMigrationLock)},
	}
	if schema != "" {
		d.migrationPrelude = append(d.migrationPrelude, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize())
	}
	return d
}

// SQLite allows one writer at a time. Writes and transactions go through a
// single connection, so in-process writers queue in Go instead of spinning
// on SQLITE_BUSY; transactions BEGIN IMMEDIATE so a transaction never has
// to upgrade a read lock. Reads outside transactions use a pool of
// read-only connections, which WAL lets run next to the writer. The busy
// timeout covers other processes sharing the file.
//
// synchronous=NORMAL: with WAL the database stays consistent and every
// commit survives a crash of the process; only an OS crash or power loss
// can drop the last commits (and with them the sandboxes of this machine).
// FULL would fsync every commit and cap the store at a few hundred writes
// per second.
const sqliteParams = "_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)" +
	"&_pragma=foreign_keys(1)&_time_integer_format=unix_micro&_inttotime=1"

func openSQLite(ctx context.Context, path string) (Store, error) {
	path = strings.TrimPrefix(path, "//") // sqlite:///abs/path
	switch {
	case path == "":
		return nil, errors.New("store url: sqlite needs a file path (sqlite:/path/to/torpor.db)")
	case strings.Contains(path, ":memory:") || strings.HasPrefix(path, "file:"):
		return nil, fmt.Errorf("store url: sqlite path %q: in-memory and URI databases are not supported, use a file", path)
	case strings.ContainsAny(path, "?#"):
		return nil, fmt.Errorf("store url: sqlite path %q must not contain '?' or '#'", path)
	}
	// The writer never checkpoints inside a commit: the checkpointer does,
	// in the background, on a connection of its own (see checkpoint.go).
	// Its savepoints (batch.go) keep their undo pages in memory
	// (temp_store), never in a temporary file.
	writer := sql.OpenDB(stmtCachingConnector{dsn: path + "?" + sqliteParams + "&_pragma=wal_autocheckpoint(0)&_pragma=temp_store(MEMORY)&_txlock=immediate", driver: &sqlite.Driver{}})
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	readers := 2 * runtime.GOMAXPROCS(0)
	reader := sql.OpenDB(stmtCachingConnector{dsn: path + "?" + sqliteParams + "&_pragma=query_only(1)", driver: &sqlite.Driver{}})
	reader.SetMaxOpenConns(readers)
	reader.SetMaxIdleConns(readers)
	ckpt := sql.OpenDB(stmtCachingConnector{dsn: path + "?" + sqliteParams, driver: &sqlite.Driver{}})
	ckpt.SetMaxOpenConns(1)
	ckpt.SetMaxIdleConns(1)
	var cp *checkpointer
	s := newSQLStore(sqliteDialect, writer, reader, func() error {
		var err error
		if cp != nil {
			err = cp.close()
		} else {
			err = ckpt.Close()
		}
		return errors.Join(err, reader.Close(), writer.Close())
	})
	// The writer migrates first: it also switches a new file to WAL before
	// any reader connects. While other processes create the same new file
	// and switch it to WAL, SQLite can answer SQLITE_BUSY without waiting
	// for the busy timeout: retried rides that out.
	if err := retried(ctx, s.migrate); err != nil {
		s.Close()
		return nil, fmt.Errorf("sqlite %s: %w", path, err)
	}
	s.batch = newBatcher(writer, s.columns)
	var err error
	if cp, err = startCheckpointer(ctx, ckpt, s.batch.exclusive); err != nil {
		s.Close()
		return nil, fmt.Errorf("sqlite %s: %w", path, err)
	}
	s.wrote = cp.wrote
	s.batch.committed = cp.wrote
	s.view = newView(executor{read: reader, write: countingWriter{db: writer, wrote: cp.wrote}, columns: s.columns})
	return s, nil
}

func openPostgres(ctx context.Context, rawURL string) (Store, error) {
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("store url: postgres: %w", err)
	}
	if !strings.Contains(rawURL, "pool_max_conns=") {
		cfg.MaxConns = postgresPoolSize()
	}
	where := redact(rawURL)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres %s: %w", where, err)
	}
	// As stdlib.OpenDBFromPool, with transactions pipelined (pgpipeline.go).
	db := sql.OpenDB(pipeliningConnector{stdlib.GetPoolConnector(pool)})
	db.SetMaxIdleConns(0)
	s := newSQLStore(postgresDialect(firstSchema(cfg.ConnConfig.RuntimeParams["search_path"])), db, db, func() error {
		err := db.Close()
		pool.Close()
		return err
	})
	// A server starting next to its database (both restarted) waits for
	// it as any store call does.
	if err := retried(ctx, s.migrate); err != nil {
		s.Close()
		return nil, fmt.Errorf("postgres %s: %w", where, err)
	}
	return s, nil
}

// postgresPoolSize is how many connections a server keeps to PostgreSQL
// unless the store URL says (pool_max_conns). pgx's own default, one per
// CPU and at least 4, suits CPU-bound queries; a control plane's
// transactions mostly wait for their commit's WAL flush, and more of them
// in flight share each flush: at 8 concurrent resume+suspend cycles on 2
// CPUs, 16 connections did 1.2× the cycles of 4 (BenchmarkBackends,
// docs/benchmarks.md).
func postgresPoolSize() int32 {
	return int32(max(16, 4*runtime.NumCPU()))
}

// firstSchema is the schema new tables land in, or "" when search_path
// leaves that to the server's default.
func firstSchema(searchPath string) string {
	first, _, _ := strings.Cut(searchPath, ",")
	first = strings.TrimSpace(first)
	if quoted, ok := strings.CutPrefix(first, `"`); ok {
		return strings.TrimSuffix(quoted, `"`)
	}
	if first == "$user" {
		return ""
	}
	// PostgreSQL folds unquoted identifiers to lower case.
	return strings.ToLower(first)
}

// redact keeps passwords out of error messages.
func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable url)"
	}
	return u.Redacted()
}
