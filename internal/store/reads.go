package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Reads gathers reads of records, of any kinds, that go to the database as
// one statement (a UNION ALL): one round trip where each read would be one
// of its own. A resume reads its template, the nodes, the free workers and
// the actor's snapshots before it claims; together they cost what one did.
//
// Add reads with ReadGet and ReadAll, call Run once, then take each read's
// result from what they returned. The collections must all be of one Tx
// (or all of the Store).
type Reads struct {
	ex    *executor
	parts []string
	args  []any
	// sinks[i] takes the rows of part i; resets empty the reads before a
	// run (again).
	sinks  []func(*rawRecord) error
	resets []func()
	// sorts put each read's records in key order after a run.
	sorts []func()
	// retry: the collections are the store's, outside a transaction,
	// whose calls are made again while the database is out of reach.
	retry bool
}

// Read is a read added to Reads; its result is there once Run returned.
type Read[T Object] struct {
	recs []T
	err  error
	// notFound, for a read of one record, is the error when it is absent.
	notFound error
}

// Record is the result of a ReadGet: ErrNotFound when absent, as Get.
func (r *Read[T]) Record() (T, error) {
	var zero T
	switch {
	case r.err != nil:
		return zero, r.err
	case len(r.recs) == 0:
		return zero, r.notFound
	}
	return r.recs[0], nil
}

// Records is the result of a ReadAll, in (space, name) order.
func (r *Read[T]) Records() ([]T, error) { return r.recs, r.err }

// ReadGet adds a read of the record (space, name) of c.
func ReadGet[T Object](rs *Reads, c Collection[T], space, name string) *Read[T] {
	r := &Read[T]{}
	cc, ok := own(rs, c)
	if !ok {
		r.err = fmt.Errorf("read %T: not a collection of the store: %w", c, ErrInvalidArgument)
		return r
	}
	r.notFound = fmt.Errorf("%s: %w", cc.describe(space, name), ErrNotFound)
	add(rs, cc, r, []string{"space = " + rs.arg(space), "name = " + rs.arg(name)})
	return r
}

// ReadAll adds a read of every record of c that opts' filter and space
// select, as ListAll (opts' page size and token are not used).
func ReadAll[T Object](rs *Reads, c Collection[T], opts ListOptions) *Read[T] {
	r := &Read[T]{}
	cc, ok := own(rs, c)
	if !ok {
		r.err = fmt.Errorf("read %T: not a collection of the store: %w", c, ErrInvalidArgument)
		return r
	}
	where, err := rs.where(func(arg func(any) string) ([]string, error) { return cc.conditions(opts, arg) })
	if err != nil {
		r.err = err
		return r
	}
	add(rs, cc, r, where)
	return r
}

// Values stands for one column's values in the records of a collection
// that a condition selects, as a subquery: a read (ReadAllIn) can select
// by what another record holds without a round trip to read it first.
type Values struct {
	// sql renders the subquery, adding its arguments with arg.
	sql func(arg func(any) string) (string, error)
}

// ValuesOf is field's value in the record (space, name) of c, if there is
// one. field is "name", "uid" or one of c's indexed columns.
func ValuesOf[T Object](c Collection[T], field, space, name string) Values {
	return Values{sql: func(arg func(any) string) (string, error) {
		return subquery(c, field, func(*collection[T]) ([]string, error) {
			return []string{"space = " + arg(space), "name = " + arg(name)}, nil
		})
	}}
}

// ValuesIn are field's values in the records of c that opts' filter and
// space select. field is "name", "uid" or one of c's indexed columns.
func ValuesIn[T Object](c Collection[T], field string, opts ListOptions) Values {
	return Values{sql: func(arg func(any) string) (string, error) {
		return subquery(c, field, func(cc *collection[T]) ([]string, error) { return cc.conditions(opts, arg) })
	}}
}

func subquery[T Object](c Collection[T], field string, conditions func(*collection[T]) ([]string, error)) (string, error) {
	cc, ok := ownCollection(c)
	if !ok {
		return "", fmt.Errorf("values of %T: not a collection of the store: %w", c, ErrInvalidArgument)
	}
	col, err := cc.selectable(field)
	if err != nil {
		return "", err
	}
	where, err := conditions(cc)
	if err != nil {
		return "", err
	}
	q := "SELECT " + col + " FROM " + cc.kind.table
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	return q, nil
}

// selectable is the table column of field: a key column or an indexed one.
func (c *collection[T]) selectable(field string) (string, error) {
	if field == "name" || field == "uid" {
		return field, nil
	}
	col, ok := c.kind.column(field)
	if !ok {
		return "", fmt.Errorf("%s: unknown field %q (indexed: %s): %w", c.kind.table, field, c.kind.columnNames(), ErrInvalidArgument)
	}
	return col.name, nil
}

// ReadAllIn adds a read of the records of c that opts' filter and space
// select and whose field ("name", "uid" or an indexed column) is among in.
func ReadAllIn[T Object](rs *Reads, c Collection[T], opts ListOptions, field string, in Values) *Read[T] {
	r := &Read[T]{}
	cc, ok := own(rs, c)
	if !ok {
		r.err = fmt.Errorf("read %T: not a collection of the store: %w", c, ErrInvalidArgument)
		return r
	}
	where, err := rs.where(func(arg func(any) string) ([]string, error) {
		where, err := cc.conditions(opts, arg)
		if err != nil {
			return nil, err
		}
		col, err := cc.selectable(field)
		if err != nil {
			return nil, err
		}
		sub, err := in.sql(arg)
		if err != nil {
			return nil, err
		}
		return append(where, col+" IN ("+sub+")"), nil
	})
	if err != nil {
		r.err = err
		return r
	}
	add(rs, cc, r, where)
	return r
}

// where builds a read's conditions; their arguments are kept only when it
// succeeds (PostgreSQL refuses a statement with arguments it does not use).
func (rs *Reads) where(build func(arg func(any) string) ([]string, error)) ([]string, error) {
	n := len(rs.args)
	where, err := build(rs.arg)
	if err != nil {
		rs.args = rs.args[:n]
	}
	return where, err
}

func (rs *Reads) arg(v any) string {
	rs.args = append(rs.args, v)
	return "$" + strconv.Itoa(len(rs.args))
}

// own returns the store's collection behind c.
func own[T Object](rs *Reads, c Collection[T]) (*collection[T], bool) {
	if _, ok := c.(retrying[T]); ok {
		rs.retry = true
	}
	return ownCollection(c)
}

func ownCollection[T Object](c Collection[T]) (*collection[T], bool) {
	switch c := c.(type) {
	case *collection[T]:
		return c, true
	case retrying[T]:
		return c.c, true
	}
	return nil, false
}

func add[T Object](rs *Reads, cc *collection[T], r *Read[T], where []string) {
	if rs.ex == nil {
		rs.ex = &cc.ex
	}
	part := "SELECT " + strconv.Itoa(len(rs.parts)) + " AS part, " + recordColumns + " FROM " + cc.kind.table
	if len(where) > 0 {
		part += " WHERE " + strings.Join(where, " AND ")
	}
	rs.parts = append(rs.parts, part)
	rs.resets = append(rs.resets, func() { r.recs = nil })
	rs.sorts = append(rs.sorts, func() {
		// Byte order, as both backends order keys (COLLATE "C").
		slices.SortFunc(r.recs, func(a, b T) int {
			am, bm := a.GetMetadata(), b.GetMetadata()
			return cmp.Or(strings.Compare(am.GetSpace(), bm.GetSpace()), strings.Compare(am.GetName(), bm.GetName()))
		})
	})
	rs.sinks = append(rs.sinks, func(raw *rawRecord) error {
		rec, err := cc.decode(raw)
		r.recs = append(r.recs, rec)
		return err
	})
}

// Run does the reads. Its error is the statement's; a read's own error
// (ErrNotFound of a ReadGet, say) is returned by its Record or Records.
func (rs *Reads) Run(ctx context.Context) error {
	if len(rs.parts) == 0 {
		return nil
	}
	if rs.retry {
		return retried(ctx, rs.run)
	}
	return rs.run(ctx)
}

func (rs *Reads) run(ctx context.Context) error {
	for _, reset := range rs.resets {
		reset()
	}
	// Unordered: an ORDER BY would sort every row with its record; each
	// read's few rows are put in key order here instead.
	query := strings.Join(rs.parts, " UNION ALL ")
	rows, err := rs.ex.read.QueryContext(ctx, query, rs.args...)
	if err != nil {
		return fmt.Errorf("read %d record sets: %w", len(rs.parts), err)
	}
	defer rows.Close()
	for rows.Next() {
		var part int64
		var raw rawRecord
		if err := rows.Scan(append([]any{&part}, raw.dest()...)...); err != nil {
			return fmt.Errorf("read %d record sets: %w", len(rs.parts), err)
		}
		if part < 0 || int(part) >= len(rs.sinks) {
			return fmt.Errorf("read %d record sets: row of part %d", len(rs.parts), part)
		}
		if err := rs.sinks[part](&raw); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %d record sets: %w", len(rs.parts), err)
	}
	for _, sort := range rs.sorts {
		sort()
	}
	return nil
}
