package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// SQLite in WAL mode appends every commit to the -wal file; a checkpoint
// copies those pages back into the database file and fsyncs both. SQLite's
// default is to run it inside the commit that crosses 1000 WAL pages, so
// one write in every ~25 store transactions paid 10-20 ms for it. The
// store turns that off on its writer connection (wal_autocheckpoint=0) and
// runs the same PASSIVE checkpoint from a connection of its own, in the
// background: after every checkpointEvery writes, and at least every
// checkpointInterval while there were writes. A PASSIVE checkpoint never
// blocks readers or the writer, and it changes nothing about durability:
// a commit is in the WAL either way, and what survives a crash is decided
// by synchronous (see sqliteParams), not by when pages are copied.
//
// A WAL only starts over from its beginning when a writer finds it fully
// copied and no reader still using it. Under a steady load of writes and
// reads that never happens by itself, and the WAL grows without bound
// (hundreds of MB within seconds at 8 goroutines), making every read
// slower: a page lookup searches the WAL's whole index. So once the WAL
// holds restartFrames pages, the checkpointer runs a RESTART checkpoint:
// it copies the little the PASSIVE one left and waits for readers to move
// on to the database file, after which the next commit writes the WAL
// from its beginning again. RESTART must have the writer's lock to itself;
// SQLite would have it poll for that lock (sleeping 1, 2, 5, ... ms) while
// the store's writer, busy, takes it again and again, so the checkpointer
// takes the store's own turn instead (batcher.exclusive): transactions
// wait in Go for the few milliseconds the RESTART takes.
const (
	checkpointEvery    = 100
	checkpointInterval = time.Second
	restartFrames      = 4096
)

// checkpointer runs PASSIVE WAL checkpoints off the request path.
type checkpointer struct {
	db   *sql.DB
	conn *sql.Conn // of db, for the checkpointer's lifetime
	// exclusive runs its function while no transaction of the store is
	// open.
	exclusive func(func())
	writes    atomic.Int64
	kick      chan struct{}
	stop      chan struct{}
	done      sync.WaitGroup
}

func startCheckpointer(ctx context.Context, db *sql.DB, exclusive func(func())) (*checkpointer, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("checkpointer: %w", err)
	}
	// It waits at most 100 ms for readers: its RESTART holds up the
	// store's writes meanwhile. Busy, it tries again at the next round.
	if _, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = 100"); err != nil {
		conn.Close()
		return nil, fmt.Errorf("checkpointer: %w", err)
	}
	c := &checkpointer{db: db, conn: conn, exclusive: exclusive, kick: make(chan struct{}, 1), stop: make(chan struct{})}
	c.done.Go(c.loop)
	return c, nil
}

// wrote counts one write (a commit); every checkpointEvery of them wake the
// checkpointer.
func (c *checkpointer) wrote() {
	if c.writes.Add(1)%checkpointEvery == 0 {
		select {
		case c.kick <- struct{}{}:
		default: // one is due already
		}
	}
}

func (c *checkpointer) loop() {
	tick := time.NewTicker(checkpointInterval)
	defer tick.Stop()
	var last int64
	for {
		select {
		case <-c.stop:
			return
		case <-c.kick:
		case <-tick.C:
			if c.writes.Load() == last {
				continue
			}
		}
		last = c.writes.Load()
		// An error (the file busy with another process's checkpoint) is
		// left to the next round: nothing depends on one checkpoint.
		if frames, err := c.checkpoint("PASSIVE"); err == nil && frames >= restartFrames {
			c.exclusive(func() { _, _ = c.checkpoint("RESTART") })
		}
	}
}

// checkpoint runs one checkpoint of mode and returns the WAL's size in
// pages.
func (c *checkpointer) checkpoint(mode string) (frames int, err error) {
	var busy, done int
	err = c.conn.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint("+mode+")").Scan(&busy, &frames, &done)
	return frames, err
}

// close stops the loop and closes its connection. The last connection to
// close checkpoints whatever is left.
func (c *checkpointer) close() error {
	close(c.stop)
	c.done.Wait()
	return errors.Join(c.conn.Close(), c.db.Close())
}

// countingWriter is the SQLite store's write handle outside transactions:
// every statement through it is one commit, counted for the checkpointer.
type countingWriter struct {
	db    *sql.DB
	wrote func()
}

func (w countingWriter) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	defer w.wrote()
	return w.db.ExecContext(ctx, query, args...)
}

func (w countingWriter) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	defer w.wrote()
	return w.db.QueryContext(ctx, query, args...)
}

func (w countingWriter) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	defer w.wrote()
	return w.db.QueryRowContext(ctx, query, args...)
}
