package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/retry"
)

// ErrUnavailable: the database could not be reached, or refused work for
// the moment (restarting, failing over, out of connections), for longer
// than the store retries. Trying again later may succeed.
var ErrUnavailable = errdefs.New(errdefs.ErrUnavailable, "store unavailable")

// transientRetry bounds how long one store call or transaction rides out
// a database restart before it answers ErrUnavailable: long enough for a
// PostgreSQL restart or failover, short enough that a request still gets
// an answer while it waits.
var transientRetry = retry.Policy{Initial: 50 * time.Millisecond, Max: time.Second, Budget: 10 * time.Second}

// transient tells whether err came from a database that is restarting or
// out of reach, rather than from the statement or the data: the same work
// may succeed when tried again.
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	// The server's own verdict first: a connection attempt it refused for a
	// reason of substance (bad password, no such database) is no weather.
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", // admin_shutdown: the server is stopping
			"57P02", // crash_shutdown: another backend crashed
			"57P03", // cannot_connect_now: starting up or in recovery
			"53300": // too_many_connections
			return true
		}
		return strings.HasPrefix(pgErr.Code, "08") // connection exceptions
	}
	var sqliteErr *sqlite.Error
	if errors.As(err, &sqliteErr) {
		// Another process held the file longer than busy_timeout.
		return sqliteErr.Code()&0xff == sqlite3.SQLITE_BUSY
	}
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr) ||
		pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// retried runs one store call (a transaction, or a single statement that
// commits by itself) again while it fails transiently, within
// transientRetry and ctx. What still fails transiently is ErrUnavailable.
//
// A connection lost during a commit leaves unknown whether the commit
// happened, and the call runs again all the same. Writes are
// compare-and-set, so a second run after a commit that did happen meets
// its own write: an Update or Delete of a version read before the call
// fails with ErrConflict (or ErrNotFound), a Create with ErrAlreadyExists,
// which callers already answer by re-reading the record. A transaction
// that reads and writes within itself re-reads what the first run
// committed; the engine's steps check there whether their step is already
// done.
func retried(ctx context.Context, call func(context.Context) error) error {
	err := call(ctx)
	if !transient(err) {
		return err // the common case pays for no backoff
	}
	for b := transientRetry.Start(); b.Wait(ctx); {
		if err = call(ctx); !transient(err) {
			return err
		}
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// retriedValue is retried for a call with a result.
func retriedValue[V any](ctx context.Context, call func(context.Context) (V, error)) (V, error) {
	var v V
	err := retried(ctx, func(ctx context.Context) error {
		var err error
		v, err = call(ctx)
		return err
	})
	return v, err
}

// The store outside a transaction: each call is a transaction of its own,
// made again while it fails transiently.

func (s *sqlStore) Spaces() Collection[*torporv1.Space] {
	return retrying[*torporv1.Space]{s.view.spaces}
}
func (s *sqlStore) Templates() Collection[*torporv1.Template] {
	return retrying[*torporv1.Template]{s.view.templates}
}
func (s *sqlStore) Revisions() Collection[*torporv1.Template] {
	return retrying[*torporv1.Template]{s.view.revisions}
}
func (s *sqlStore) Actors() Collection[*torporv1.Actor] {
	return retrying[*torporv1.Actor]{s.view.actors}
}
func (s *sqlStore) Workers() Collection[*torporv1.Worker] {
	return retrying[*torporv1.Worker]{s.view.workers}
}
func (s *sqlStore) Snapshots() Collection[*torporv1.Snapshot] {
	return retrying[*torporv1.Snapshot]{s.view.snapshots}
}
func (s *sqlStore) Tags() Collection[*torporv1.SnapshotTag] {
	return retrying[*torporv1.SnapshotTag]{s.view.tags}
}
func (s *sqlStore) Nodes() Collection[*torporv1.Node] { return retrying[*torporv1.Node]{s.view.nodes} }

func (s *sqlStore) AppendEvent(ctx context.Context, ev Event) error {
	return retried(ctx, func(ctx context.Context) error { return s.view.AppendEvent(ctx, ev) })
}

func (s *sqlStore) Events(ctx context.Context, actorUID string, limit int) ([]Event, error) {
	return retriedValue(ctx, func(ctx context.Context) ([]Event, error) { return s.view.Events(ctx, actorUID, limit) })
}

func (s *sqlStore) GetOrCreateSecret(ctx context.Context, name string, create func() ([]byte, error)) ([]byte, error) {
	return retriedValue(ctx, func(ctx context.Context) ([]byte, error) { return s.view.GetOrCreateSecret(ctx, name, create) })
}

func (s *sqlStore) GetSecret(ctx context.Context, name string) ([]byte, error) {
	return retriedValue(ctx, func(ctx context.Context) ([]byte, error) { return s.view.GetSecret(ctx, name) })
}

func (s *sqlStore) DeleteSecret(ctx context.Context, name string) error {
	return retried(ctx, func(ctx context.Context) error { return s.view.DeleteSecret(ctx, name) })
}

func (s *sqlStore) ListSecrets(ctx context.Context, prefix string) ([]Secret, error) {
	return retriedValue(ctx, func(ctx context.Context) ([]Secret, error) { return s.view.ListSecrets(ctx, prefix) })
}

// retrying is a collection outside a transaction.
type retrying[T Object] struct{ c *collection[T] }

func (r retrying[T]) Create(ctx context.Context, obj T) (T, error) {
	return retriedValue(ctx, func(ctx context.Context) (T, error) { return r.c.Create(ctx, obj) })
}

func (r retrying[T]) Get(ctx context.Context, space, name string) (T, error) {
	return retriedValue(ctx, func(ctx context.Context) (T, error) { return r.c.Get(ctx, space, name) })
}

func (r retrying[T]) List(ctx context.Context, opts ListOptions) ([]T, string, error) {
	var next string
	recs, err := retriedValue(ctx, func(ctx context.Context) ([]T, error) {
		var err error
		var recs []T
		recs, next, err = r.c.List(ctx, opts)
		return recs, err
	})
	return recs, next, err
}

func (r retrying[T]) Update(ctx context.Context, obj T) (T, error) {
	return retriedValue(ctx, func(ctx context.Context) (T, error) { return r.c.Update(ctx, obj) })
}

func (r retrying[T]) Delete(ctx context.Context, space, name, uid string, version int64) error {
	return retried(ctx, func(ctx context.Context) error { return r.c.Delete(ctx, space, name, uid, version) })
}
