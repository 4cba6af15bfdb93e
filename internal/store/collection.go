package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// ErrInvalidArgument: a record, filter or page token the store cannot
// accept (the message names which).
var ErrInvalidArgument = errdefs.ErrInvalidArgument

// Page sizes of List.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

var marshalOptions = proto.MarshalOptions{Deterministic: true}

// collection is the one Collection implementation, for every kind.
type collection[T Object] struct {
	kind *kind[T]
	ex   executor
}

func (c *collection[T]) Create(ctx context.Context, obj T) (T, error) {
	var zero T
	rec, meta, err := c.prepare(obj)
	if err != nil {
		return zero, err
	}
	t := now()
	if meta.Uid == "" {
		meta.Uid = uuid.NewString()
	}
	meta.Version = 1
	meta.CreateTime = timestamppb.New(t)
	meta.UpdateTime = meta.CreateTime
	data, err := marshalOptions.Marshal(rec)
	if err != nil {
		return zero, fmt.Errorf("create %s: encode: %w", c.describe(meta.Space, meta.Name), err)
	}
	values := c.columnValues(rec)
	args := append([]any{meta.Space, meta.Name, meta.Uid, meta.Version, t, t, data}, anys(values)...)
	// ON CONFLICT DO NOTHING rather than a unique-violation error: on
	// PostgreSQL a failed statement would abort the caller's transaction.
	res, err := c.ex.write.ExecContext(ctx, c.kind.insertSQL, args...)
	if err != nil {
		return zero, fmt.Errorf("create %s: %w", c.describe(meta.Space, meta.Name), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return zero, fmt.Errorf("create %s: %w", c.describe(meta.Space, meta.Name), err)
	}
	if n == 0 {
		return zero, c.createConflict(ctx, meta.Space, meta.Name, meta.Uid)
	}
	c.ex.columns.put(c.kind.table, meta.Uid, meta.Version, values)
	return rec, nil
}

// createConflict tells which unique key an insert that stored nothing hit.
func (c *collection[T]) createConflict(ctx context.Context, space, name, uid string) error {
	what := c.describe(space, name)
	_, _, found, err := c.current(ctx, space, name)
	switch {
	case err != nil:
		return fmt.Errorf("create %s: %w", what, err)
	case found:
		return fmt.Errorf("%s: %w", what, ErrAlreadyExists)
	}
	return fmt.Errorf("create %s: uid %s, or another key unique across spaces (an actor's sandbox ID), is taken by another %s: %w", what, uid, c.kind.name, ErrAlreadyExists)
}

func (c *collection[T]) Get(ctx context.Context, space, name string) (T, error) {
	var zero T
	rows, err := c.ex.read.QueryContext(ctx, c.kind.getSQL, space, name)
	if err != nil {
		return zero, fmt.Errorf("get %s: %w", c.describe(space, name), err)
	}
	recs, err := c.scan(rows)
	if err != nil {
		return zero, fmt.Errorf("get %s: %w", c.describe(space, name), err)
	}
	if len(recs) == 0 {
		return zero, fmt.Errorf("%s: %w", c.describe(space, name), ErrNotFound)
	}
	return recs[0], nil
}

func (c *collection[T]) List(ctx context.Context, opts ListOptions) ([]T, string, error) {
	plural := c.kind.table
	size := opts.PageSize
	switch {
	case size <= 0:
		size = DefaultPageSize
	case size > MaxPageSize:
		size = MaxPageSize
	}
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where, err := c.conditions(opts, arg)
	if err != nil {
		return nil, "", err
	}
	if opts.PageToken != "" {
		space, name, err := decodePageToken(opts.PageToken)
		if err != nil {
			return nil, "", fmt.Errorf("list %s: %w", plural, err)
		}
		switch {
		case opts.Space == "":
			// Row values compare like the (space, name) index is ordered.
			where = append(where, fmt.Sprintf("(space, name) > (%s, %s)", arg(space), arg(name)))
		case space == opts.Space:
			where = append(where, "name > "+arg(name))
		default:
			return nil, "", fmt.Errorf("list %s: page token belongs to space %q, not %q: %w", plural, space, opts.Space, ErrInvalidArgument)
		}
	}
	query := "SELECT " + recordColumns + " FROM " + c.kind.table
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	// One row more than the page tells whether another page follows.
	query += " ORDER BY space, name LIMIT " + arg(size+1)
	rows, err := c.ex.read.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list %s: %w", plural, err)
	}
	recs, err := c.scan(rows)
	if err != nil {
		return nil, "", fmt.Errorf("list %s: %w", plural, err)
	}
	if len(recs) <= size {
		return recs, "", nil
	}
	recs = recs[:size]
	last := recs[size-1].GetMetadata()
	return recs, encodePageToken(last.GetSpace(), last.GetName()), nil
}

// conditions are the WHERE conditions of opts' filter and space; arg
// adds an argument and returns its placeholder.
func (c *collection[T]) conditions(opts ListOptions, arg func(any) string) ([]string, error) {
	var where []string
	for _, field := range slices.Sorted(maps.Keys(opts.Filter)) {
		col, ok := c.kind.column(field)
		if !ok {
			return nil, fmt.Errorf("list %s: unknown filter field %q (indexed: %s): %w", c.kind.table, field, c.kind.columnNames(), ErrInvalidArgument)
		}
		v, err := col.normalize(opts.Filter[field])
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", c.kind.table, err)
		}
		where = append(where, col.name+" = "+arg(v))
	}
	if opts.Space != "" {
		where = append(where, "space = "+arg(opts.Space))
	}
	return where, nil
}

func (c *collection[T]) Update(ctx context.Context, obj T) (T, error) {
	var zero T
	rec, meta, err := c.prepare(obj)
	if err != nil {
		return zero, err
	}
	what := c.describe(meta.Space, meta.Name)
	expected := meta.Version
	t := now()
	meta.Version = expected + 1
	meta.UpdateTime = timestamppb.New(t)
	data, err := marshalOptions.Marshal(rec)
	if err != nil {
		return zero, fmt.Errorf("update %s: encode: %w", what, err)
	}
	values := c.columnValues(rec)
	var created time.Time
	// Indexed columns known to keep their value are left alone (see
	// columns.go); when that guess is wrong, the full update follows.
	err = sql.ErrNoRows
	if keep := c.unchanged(meta.Uid, expected, values); keep != 0 {
		args := []any{meta.Version, t, data}
		for i, v := range values {
			if keep&(1<<i) == 0 {
				args = append(args, v)
			}
		}
		args = append(args, meta.Space, meta.Name, meta.Uid, expected)
		for i, v := range values {
			if keep&(1<<i) != 0 {
				args = append(args, v)
			}
		}
		err = c.ex.write.QueryRowContext(ctx, c.kind.updateKeeping[keep], args...).Scan(&created)
	}
	if errors.Is(err, sql.ErrNoRows) {
		args := append([]any{meta.Version, t, data}, anys(values)...)
		args = append(args, meta.Space, meta.Name, meta.Uid, expected)
		err = c.ex.write.QueryRowContext(ctx, c.kind.updateSQL, args...).Scan(&created)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return zero, c.mismatch(ctx, "update", meta.Space, meta.Name, meta.Uid, expected)
	}
	if err != nil {
		return zero, fmt.Errorf("update %s: %w", what, err)
	}
	// The create time is the stored one, whatever the caller sent.
	meta.CreateTime = timestamppb.New(created)
	c.ex.columns.put(c.kind.table, meta.Uid, meta.Version, values)
	return rec, nil
}

func (c *collection[T]) Delete(ctx context.Context, space, name, uid string, version int64) error {
	query := "DELETE FROM " + c.kind.table + " WHERE space = $1 AND name = $2"
	args := []any{space, name}
	if uid != "" {
		args = append(args, uid)
		query += " AND uid = $" + strconv.Itoa(len(args))
	}
	if version != 0 {
		args = append(args, version)
		query += " AND version = $" + strconv.Itoa(len(args))
	}
	res, err := c.ex.write.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("delete %s: %w", c.describe(space, name), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("delete %s: %w", c.describe(space, name), err)
	}
	if n == 0 {
		return c.mismatch(ctx, "delete", space, name, uid, version)
	}
	return nil
}

// mismatch explains a compare-and-set that changed nothing: the record is
// gone (ErrNotFound) or has another uid or version (ErrConflict).
func (c *collection[T]) mismatch(ctx context.Context, op, space, name, uid string, version int64) error {
	what := c.describe(space, name)
	storedUID, storedVersion, found, err := c.current(ctx, space, name)
	switch {
	case err != nil:
		return fmt.Errorf("%s %s: %w", op, what, err)
	case !found:
		return fmt.Errorf("%s %s: %w", op, what, ErrNotFound)
	case uid != storedUID && (uid != "" || op == "update"): // delete checks only a given uid
		return fmt.Errorf("%s %s: uid %q does not match stored uid %s: %w", op, what, uid, storedUID, ErrConflict)
	}
	return fmt.Errorf("%s %s: version %d does not match stored version %d: %w", op, what, version, storedVersion, ErrConflict)
}

func (c *collection[T]) current(ctx context.Context, space, name string) (uid string, version int64, found bool, err error) {
	err = c.ex.read.QueryRowContext(ctx, c.kind.currentSQL, space, name).Scan(&uid, &version)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, false, nil
	}
	return uid, version, err == nil, err
}

// prepare copies obj (the caller's message is never changed) and checks
// its key.
func (c *collection[T]) prepare(obj T) (T, *torporv1.ObjectMeta, error) {
	var zero T
	if !obj.ProtoReflect().IsValid() {
		return zero, nil, fmt.Errorf("%s: record is nil: %w", c.kind.name, ErrInvalidArgument)
	}
	rec := proto.CloneOf(obj)
	meta := c.kind.metadata(rec)
	if meta.GetName() == "" {
		return zero, nil, fmt.Errorf("%s: metadata.name is required: %w", c.kind.name, ErrInvalidArgument)
	}
	return rec, meta, nil
}

func (c *collection[T]) columnValues(rec T) []string {
	vals := make([]string, len(c.kind.columns))
	for i, col := range c.kind.columns {
		vals[i] = col.value(rec)
	}
	return vals
}

// unchanged returns the bit set of the indexed columns whose stored value
// at (uid, version) is known to equal values (bit i: column i).
func (c *collection[T]) unchanged(uid string, version int64, values []string) int {
	old, ok := c.ex.columns.get(c.kind.table, uid, version)
	if !ok || len(old) != len(values) {
		return 0
	}
	keep := 0
	for i := range values {
		if old[i] == values[i] {
			keep |= 1 << i
		}
	}
	return keep
}

func anys(values []string) []any {
	a := make([]any, len(values))
	for i, v := range values {
		a[i] = v
	}
	return a
}

// scan decodes rows of recordColumns.
func (c *collection[T]) scan(rows *sql.Rows) ([]T, error) {
	defer rows.Close()
	var recs []T
	for rows.Next() {
		var r rawRecord
		if err := rows.Scan(r.dest()...); err != nil {
			return nil, err
		}
		rec, err := c.decode(&r)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, rows.Err()
}

// rawRecord is one row of recordColumns.
type rawRecord struct {
	space, name, uid       string
	version                int64
	createTime, updateTime time.Time
	data                   []byte
}

func (r *rawRecord) dest() []any {
	return []any{&r.space, &r.name, &r.uid, &r.version, &r.createTime, &r.updateTime, &r.data}
}

// decode makes the record of a row. The key, uid, version and times come
// from their columns, so a record never disagrees with what the store
// compares against.
func (c *collection[T]) decode(r *rawRecord) (T, error) {
	rec := newObject[T]()
	if err := proto.Unmarshal(r.data, rec); err != nil {
		var zero T
		return zero, fmt.Errorf("decode %s: %w", c.describe(r.space, r.name), err)
	}
	meta := c.kind.metadata(rec)
	meta.Space, meta.Name, meta.Uid, meta.Version = r.space, r.name, r.uid, r.version
	if c.ex.columns != nil && len(c.kind.columns) > 0 {
		c.ex.columns.put(c.kind.table, r.uid, r.version, c.columnValues(rec))
	}
	meta.CreateTime = timestamppb.New(r.createTime)
	meta.UpdateTime = timestamppb.New(r.updateTime)
	return rec, nil
}

// describe names a record in messages: "actor default/web".
func (c *collection[T]) describe(space, name string) string {
	if space == "" {
		return c.kind.name + " " + name
	}
	return c.kind.name + " " + space + "/" + name
}

// A page token is the key of the last record returned; the next page
// starts after it.
func encodePageToken(space, name string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(space + "\x00" + name))
}

func decodePageToken(token string) (space, name string, err error) {
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err == nil {
		var ok bool
		if space, name, ok = strings.Cut(string(raw), "\x00"); ok {
			return space, name, nil
		}
	}
	return "", "", fmt.Errorf("malformed page token %q: %w", token, ErrInvalidArgument)
}
