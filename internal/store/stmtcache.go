package store

import (
	"context"
	"database/sql/driver"
	"fmt"
)

// stmtCachingConnector makes SQLite connections that keep their prepared
// statements: parsing a statement costs more than running one of the
// store's short statements, and the store uses a small, fixed set of
// statement texts. (pgx caches statements by itself.)
type stmtCachingConnector struct {
	dsn    string
	driver driver.Driver
}

func (c stmtCachingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.driver.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	full, ok := conn.(sqliteConn)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("sqlite connection %T lacks the context methods the store needs", conn)
	}
	return &stmtCachingConn{sqliteConn: full, stmts: map[string]cachedStmt{}}, nil
}

func (c stmtCachingConnector) Driver() driver.Driver { return c.driver }

// sqliteConn is what database/sql uses of a modernc.org/sqlite connection.
type sqliteConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.SessionResetter
	driver.Validator
	driver.Pinger
}

type cachedStmt interface {
	driver.Stmt
	driver.StmtExecContext
	driver.StmtQueryContext
}

// stmtCachingConn is used by one goroutine at a time (database/sql
// guarantees it). A statement is reused only after the rows of its previous
// run are closed, which holds because the store reads every result set to
// the end before running another statement.
type stmtCachingConn struct {
	sqliteConn
	stmts map[string]cachedStmt
}

func (c *stmtCachingConn) stmt(ctx context.Context, query string) (cachedStmt, error) {
	if s, ok := c.stmts[query]; ok {
		return s, nil
	}
	s, err := c.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	cs, ok := s.(cachedStmt)
	if !ok {
		s.Close()
		return nil, fmt.Errorf("sqlite statement %T lacks the context methods the store needs", s)
	}
	c.stmts[query] = cs
	return cs, nil
}

// Statements without arguments are one-offs (schema changes, pragmas) and
// are not kept, except the savepoints of group commit (batch.go), which
// run for every transaction.
var keptWithoutArgs = map[string]bool{savepointSQL: true, releaseSQL: true, rollbackToSQL: true}

func (c *stmtCachingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if len(args) == 0 && !keptWithoutArgs[query] {
		return c.sqliteConn.ExecContext(ctx, query, args)
	}
	s, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return s.ExecContext(ctx, args)
}

func (c *stmtCachingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if len(args) == 0 {
		return c.sqliteConn.QueryContext(ctx, query, args)
	}
	s, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return s.QueryContext(ctx, args)
}

func (c *stmtCachingConn) Close() error {
	for _, s := range c.stmts {
		s.Close()
	}
	return c.sqliteConn.Close()
}
