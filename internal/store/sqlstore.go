package store

import (
	"context"
	"database/sql"
	"fmt"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// dbtx is what both a database handle and a transaction offer.
type dbtx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// executor routes reads and writes; outside a transaction on SQLite they
// go to different connection pools, inside one both are the transaction.
type executor struct {
	read, write dbtx
	// columns, when set, remembers indexed column values (columns.go).
	columns *columnCache
}

// view is the Tx implementation over one executor.
type view struct {
	ex        executor
	spaces    *collection[*torporv1.Space]
	templates *collection[*torporv1.Template]
	revisions *collection[*torporv1.Template]
	actors    *collection[*torporv1.Actor]
	workers   *collection[*torporv1.Worker]
	snapshots *collection[*torporv1.Snapshot]
	tags      *collection[*torporv1.SnapshotTag]
	nodes     *collection[*torporv1.Node]
}

func newView(ex executor) *view {
	return &view{
		ex:        ex,
		spaces:    &collection[*torporv1.Space]{kind: spaceKind, ex: ex},
		templates: &collection[*torporv1.Template]{kind: templateKind, ex: ex},
		revisions: &collection[*torporv1.Template]{kind: revisionKind, ex: ex},
		actors:    &collection[*torporv1.Actor]{kind: actorKind, ex: ex},
		workers:   &collection[*torporv1.Worker]{kind: workerKind, ex: ex},
		snapshots: &collection[*torporv1.Snapshot]{kind: snapshotKind, ex: ex},
		tags:      &collection[*torporv1.SnapshotTag]{kind: tagKind, ex: ex},
		nodes:     &collection[*torporv1.Node]{kind: nodeKind, ex: ex},
	}
}

func (v *view) Spaces() Collection[*torporv1.Space]       { return v.spaces }
func (v *view) Templates() Collection[*torporv1.Template] { return v.templates }
func (v *view) Revisions() Collection[*torporv1.Template] { return v.revisions }
func (v *view) Actors() Collection[*torporv1.Actor]       { return v.actors }
func (v *view) Workers() Collection[*torporv1.Worker]     { return v.workers }
func (v *view) Snapshots() Collection[*torporv1.Snapshot] { return v.snapshots }
func (v *view) Tags() Collection[*torporv1.SnapshotTag]   { return v.tags }
func (v *view) Nodes() Collection[*torporv1.Node]         { return v.nodes }

// sqlStore is the Store of both backends; only the dialect and the
// connection setup differ.
type sqlStore struct {
	*view
	dialect *dialect
	// writer runs transactions (and, on SQLite, every write).
	writer *sql.DB
	// wrote, when set, is told of every commit (SQLite's checkpointer).
	wrote func()
	// batch, when set, runs InTx with group commit (SQLite).
	batch *batcher
	// columns is shared by every view of the store.
	columns *columnCache
	close   func() error
}

func newSQLStore(d *dialect, writer, reader *sql.DB, close func() error) *sqlStore {
	columns := newColumnCache()
	return &sqlStore{
		view:    newView(executor{read: reader, write: writer, columns: columns}),
		dialect: d,
		writer:  writer,
		columns: columns,
		close:   close,
	}
}

// InTx runs fn in one transaction. Inside fn, use only the Tx it is given:
// on SQLite the store's own write path waits for the transaction to end.
// A transaction that fails transiently runs again from its BEGIN (see
// retried); on SQLite that is a new turn in the batcher's queue, so no
// batch is held open while it waits.
func (s *sqlStore) InTx(ctx context.Context, fn func(tx Tx) error) error {
	return retried(ctx, func(ctx context.Context) error { return s.inTx(ctx, fn) })
}

func (s *sqlStore) inTx(ctx context.Context, fn func(tx Tx) error) error {
	if s.batch != nil {
		return s.batch.inTx(ctx, fn)
	}
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	committed := false
	defer func() {
		// Also on panic: the connection goes back to the pool clean.
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if err := fn(newView(executor{read: tx, write: tx, columns: s.columns})); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	committed = true
	if s.wrote != nil {
		s.wrote()
	}
	return nil
}

func (s *sqlStore) Close() error { return s.close() }
