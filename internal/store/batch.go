package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
)

// maxBatch bounds how many transactions share one SQLite commit, so the
// first member of a batch does not wait behind an endless stream.
const maxBatch = 16

// batcher is SQLite's InTx: group commit. SQLite has one writer, so
// transactions run one after the other anyway; when several are waiting,
// they run back to back inside one SQLite transaction, each in a savepoint
// of its own, and commit together. A commit writes every page its
// transaction changed to the WAL, and concurrent transactions change many
// of the same pages (the event log's tail, index leaves), so one commit
// for several writes a fraction of the pages.
//
// For each caller this is the same as a transaction of its own:
//   - fn runs alone on the connection (members run one at a time) and sees
//     the writes of the members before it, as it would have seen them
//     committed had it run after them;
//   - when fn fails, its savepoint is rolled back and the others' writes
//     stay; InTx returns fn's error only once the batch committed;
//   - InTx returns only after the commit: nothing a caller does after
//     InTx returns (a node call) runs before its writes are durable;
//   - when the commit fails, every member gets the error.
//
// A member's statements ignore its context's cancellation: SQLite answers
// an interrupted write inside a transaction by rolling back the whole
// transaction, which would take the other members' writes with it.
// Statements are short; a cancelled fn still ends at its next context
// check.
type batcher struct {
	db *sql.DB
	// turn is held by the member running its fn (capacity 1).
	turn chan struct{}
	// waiting counts callers waiting for the turn: while there are any,
	// the batch stays open for them.
	waiting atomic.Int32
	// exclusiveWaiting counts callers of exclusive waiting: while there
	// are any, every member commits before it gives up the turn.
	exclusiveWaiting atomic.Int32
	// cur is the open batch; only the holder of turn reads or writes it.
	cur *batch
	// committed is told of every commit.
	committed func()
	columns   *columnCache
}

type batch struct {
	tx      *sql.Tx
	members int
	done    chan struct{}
	err     error // the commit's, read after done is closed
}

func newBatcher(db *sql.DB, columns *columnCache) *batcher {
	return &batcher{db: db, turn: make(chan struct{}, 1), columns: columns}
}

func (b *batcher) inTx(ctx context.Context, fn func(tx Tx) error) (err error) {
	// The wait for the turn ignores ctx: a member that left the queue
	// after the batch was kept open for it would leave the batch without
	// anyone to commit it. The wait is bounded by the members' fns.
	b.waiting.Add(1)
	b.turn <- struct{}{}
	b.waiting.Add(-1)
	bt := b.cur
	if bt == nil {
		if err := ctx.Err(); err != nil {
			<-b.turn
			return err
		}
		// Not bound to this caller's context: cancelling it must not roll
		// back the other members' writes.
		tx, err := b.db.BeginTx(context.WithoutCancel(ctx), nil)
		if err != nil {
			<-b.turn
			return fmt.Errorf("begin transaction: %w", err)
		}
		bt = &batch{tx: tx, done: make(chan struct{})}
		b.cur = bt
	}
	bt.members++

	var fnErr, broken error
	var p any
	if bt.members == 1 {
		// The first member needs no savepoint: when it fails, the whole
		// transaction is rolled back and the batch ends with it.
		p, fnErr = b.runFn(ctx, bt.tx, fn)
		if fnErr != nil || p != nil {
			_ = bt.tx.Rollback()
			b.finish(bt, nil)
			if p != nil {
				panic(p)
			}
			return fnErr
		}
	} else {
		fnErr, p, broken = b.runMember(ctx, bt.tx, fn)
	}
	switch {
	case broken != nil:
		// The transaction is gone (SQLite rolled it back): end the batch
		// now, so no later member runs outside a transaction.
		_ = bt.tx.Rollback()
		b.finish(bt, fmt.Errorf("transaction aborted: %w", broken))
	case b.waiting.Load() == 0 || bt.members >= maxBatch || b.exclusiveWaiting.Load() > 0:
		var err error
		if err = bt.tx.Commit(); err != nil {
			err = fmt.Errorf("commit transaction: %w", err)
		} else if b.committed != nil {
			b.committed()
		}
		b.finish(bt, err)
	default:
		// A caller is waiting for the turn: it runs in this batch, and the
		// last member commits.
		<-b.turn
		<-bt.done
	}
	if p != nil {
		panic(p)
	}
	if bt.err != nil {
		return bt.err
	}
	return fnErr
}

// exclusive runs f while no transaction of the store is open: it holds
// the turn at a moment when no batch is open.
func (b *batcher) exclusive(f func()) {
	b.exclusiveWaiting.Add(1)
	defer b.exclusiveWaiting.Add(-1)
	for {
		b.turn <- struct{}{}
		if b.cur == nil {
			break
		}
		// A member left the batch open for a caller waiting behind us; it
		// gets the turn now and, seeing us wait, commits.
		<-b.turn
		runtime.Gosched()
	}
	defer func() { <-b.turn }()
	f()
}

// finish ends bt with err (nil: committed) and gives up the turn.
func (b *batcher) finish(bt *batch, err error) {
	bt.err = err
	b.cur = nil
	close(bt.done)
	<-b.turn
}

const (
	savepointSQL  = "SAVEPOINT member"
	releaseSQL    = "RELEASE member"
	rollbackToSQL = "ROLLBACK TO member"
)

// runFn runs fn on tx and returns its error, or what it panicked with.
func (b *batcher) runFn(ctx context.Context, tx *sql.Tx, fn func(tx Tx) error) (panicked any, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			err, panicked = fmt.Errorf("panic in transaction: %v", p), p
		}
	}()
	ex := uncancelable{tx}
	return nil, fn(newView(executor{read: ex, write: ex, columns: b.columns}))
}

// runMember runs fn in a savepoint of tx. broken is set when the
// savepoint could not be opened, released or rolled back: the
// transaction is no longer usable.
func (b *batcher) runMember(ctx context.Context, tx *sql.Tx, fn func(tx Tx) error) (fnErr error, panicked any, broken error) {
	bg := context.WithoutCancel(ctx)
	if _, err := tx.ExecContext(bg, savepointSQL); err != nil {
		return err, nil, err
	}
	panicked, fnErr = b.runFn(ctx, tx, fn)
	if fnErr != nil {
		if _, err := tx.ExecContext(bg, rollbackToSQL); err != nil {
			return fnErr, panicked, err
		}
	}
	if _, err := tx.ExecContext(bg, releaseSQL); err != nil {
		return fnErr, panicked, errors.Join(fnErr, err)
	}
	return fnErr, panicked, nil
}

// uncancelable runs statements without their context's cancellation (see
// batcher).
type uncancelable struct{ tx *sql.Tx }

func (u uncancelable) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return u.tx.ExecContext(context.WithoutCancel(ctx), query, args...)
}

func (u uncancelable) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return u.tx.QueryContext(context.WithoutCancel(ctx), query, args...)
}

func (u uncancelable) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return u.tx.QueryRowContext(context.WithoutCancel(ctx), query, args...)
}
