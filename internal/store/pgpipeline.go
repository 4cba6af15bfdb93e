package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// On PostgreSQL every statement is a round trip to the server, and a
// transaction adds two of its own: BEGIN and COMMIT. The store's
// transactions are short (a resume's claim is three statements), so those
// two are a large share of their cost. pipeliningConn saves them: BEGIN is
// sent together with the transaction's first statement, and statements
// whose result nobody reads (deferred, below) wait and go out together
// with the next statement or the COMMIT. Each such group is one pgx batch:
// one network write, one wait for all the answers. The server runs the
// statements in order, as it would have one by one; a failure in a group
// fails the statement that carried it, or the commit, which then rolls
// the transaction back.

// deferredKey marks a statement's context: its result may arrive later.
type deferredKey struct{}

// deferrable lets the statement run with ctx wait for the next statement of
// its transaction, or its commit; its failure then fails that one.
// Outside a transaction, and on SQLite, it runs at once.
func deferrable(ctx context.Context) context.Context {
	return context.WithValue(ctx, deferredKey{}, true)
}

// pipeliningConnector makes the connections of the PostgreSQL store.
type pipeliningConnector struct{ driver.Connector }

func (c pipeliningConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc, ok := conn.(*stdlib.Conn)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("postgres connection %T is not pgx's", conn)
	}
	return &pipeliningConn{Conn: sc}, nil
}

// pipeliningConn is used by one goroutine at a time (database/sql
// guarantees it).
type pipeliningConn struct {
	*stdlib.Conn
	// txCtx is the context of the open transaction, nil outside one.
	txCtx context.Context
	// begun: BEGIN was sent.
	begun bool
	// deferred statements wait to be sent.
	deferred []queued
}

type queued struct {
	query string
	args  []any
}

func (c *pipeliningConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if opts != (driver.TxOptions{}) {
		return c.Conn.BeginTx(ctx, opts)
	}
	if c.Conn.Conn().IsClosed() {
		return nil, driver.ErrBadConn
	}
	c.txCtx, c.begun, c.deferred = ctx, false, nil
	return pipelinedTx{c}, nil
}

// waiting reports whether statements wait to go out before the next one.
func (c *pipeliningConn) waiting() bool {
	return c.txCtx != nil && (!c.begun || len(c.deferred) > 0)
}

// batch queues what waits, then query: the results of all but the last
// are read by send.
func (c *pipeliningConn) batch(query string, args []any) *pgx.Batch {
	b := &pgx.Batch{}
	if !c.begun {
		b.Queue("BEGIN")
	}
	for _, q := range c.deferred {
		b.Queue(q.query, q.args...)
	}
	b.Queue(query, args...)
	return b
}

// send sends b and reads the results of what waited (all but the last
// query); the caller reads the last one and closes the results.
func (c *pipeliningConn) send(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	br := c.Conn.Conn().SendBatch(ctx, b)
	// Whatever happens next, BEGIN reached the server or the connection
	// is broken: a rollback is due either way.
	c.begun, c.deferred = true, nil
	for range b.Len() - 1 {
		if _, err := br.Exec(); err != nil {
			return nil, errors.Join(err, br.Close())
		}
	}
	return br, nil
}

func (c *pipeliningConn) ExecContext(ctx context.Context, query string, named []driver.NamedValue) (driver.Result, error) {
	if c.txCtx != nil && ctx.Value(deferredKey{}) != nil {
		c.deferred = append(c.deferred, queued{query, values(named)})
		return deferredResult{}, nil
	}
	if !c.waiting() {
		return c.Conn.ExecContext(ctx, query, named)
	}
	br, err := c.send(ctx, c.batch(query, values(named)))
	if err != nil {
		return nil, badConn(err)
	}
	tag, err := br.Exec()
	if err = errors.Join(err, br.Close()); err != nil {
		return nil, err
	}
	return driver.RowsAffected(tag.RowsAffected()), nil
}

func (c *pipeliningConn) QueryContext(ctx context.Context, query string, named []driver.NamedValue) (driver.Rows, error) {
	if !c.waiting() {
		return c.Conn.QueryContext(ctx, query, named)
	}
	br, err := c.send(ctx, c.batch(query, values(named)))
	if err != nil {
		return nil, badConn(err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, errors.Join(err, br.Close())
	}
	// The first row is read now: it carries the statement's error, and
	// the column names database/sql asks for first.
	r := &batchRows{rows: rows, br: br, more: rows.Next()}
	if err := rows.Err(); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	return r, nil
}

// badConn tells database/sql to try another connection when the group
// never reached the server.
func badConn(err error) error {
	if pgconn.SafeToRetry(err) {
		return driver.ErrBadConn
	}
	return err
}

func values(named []driver.NamedValue) []any {
	args := make([]any, len(named))
	for i, v := range named {
		args[i] = v.Value
	}
	return args
}

// deferredResult is the result of a deferred statement: not known yet.
type deferredResult struct{}

var errDeferred = errors.New("the statement's result is not known until its transaction commits")

func (deferredResult) LastInsertId() (int64, error) { return 0, errDeferred }
func (deferredResult) RowsAffected() (int64, error) { return 0, errDeferred }

// pipelinedTx is the transaction of a pipeliningConn.
type pipelinedTx struct{ c *pipeliningConn }

func (t pipelinedTx) Commit() error {
	c := t.c
	ctx := c.txCtx
	defer c.endTx()
	if !c.begun && len(c.deferred) == 0 {
		return nil // nothing was sent: nothing to commit
	}
	br, err := c.send(ctx, c.batch("COMMIT", nil))
	if err == nil {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		err = errors.Join(err, br.Close())
		// A transaction that failed before answers COMMIT with ROLLBACK.
		if err == nil && tag.String() == "ROLLBACK" {
			err = pgx.ErrTxCommitRollback
		}
	}
	if err != nil {
		c.rollback(ctx)
	}
	return err
}

func (t pipelinedTx) Rollback() error {
	c := t.c
	defer c.endTx()
	if !c.begun {
		return nil
	}
	_, err := c.Conn.Conn().Exec(c.txCtx, "ROLLBACK")
	return err
}

// rollback ends a transaction a failed commit left open, so the connection
// goes back to the pool clean (or, failing that, is discarded by
// ResetSession).
func (c *pipeliningConn) rollback(ctx context.Context) {
	if conn := c.Conn.Conn(); !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
}

func (c *pipeliningConn) endTx() { c.txCtx, c.begun, c.deferred = nil, false, nil }

// batchRows are the rows of the last query of a batch; closing them
// closes the batch.
type batchRows struct {
	rows  pgx.Rows
	br    pgx.BatchResults
	more  bool // the row read ahead, if any, is not yet returned
	ahead bool
	cols  []string
}

func (r *batchRows) Columns() []string {
	if r.cols == nil {
		for _, fd := range r.rows.FieldDescriptions() {
			r.cols = append(r.cols, fd.Name)
		}
	}
	return r.cols
}

func (r *batchRows) Next(dest []driver.Value) error {
	if r.ahead {
		r.more = r.rows.Next()
	}
	r.ahead = true
	if !r.more {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return io.EOF
	}
	vals, err := r.rows.Values()
	if err != nil {
		return err
	}
	for i, v := range vals {
		dest[i] = v
	}
	return nil
}

func (r *batchRows) Close() error {
	r.rows.Close()
	return errors.Join(r.rows.Err(), r.br.Close())
}
