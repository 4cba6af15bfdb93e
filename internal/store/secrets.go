package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// GetOrCreateSecret returns the secret stored under name, storing the
// value create makes when there is none. Whoever inserts first wins: every
// concurrent caller, on any replica, gets the same bytes, which need not be
// the ones its own create made.
func (v *view) GetOrCreateSecret(ctx context.Context, name string, create func() ([]byte, error)) ([]byte, error) {
	data, err := v.GetSecret(ctx, name)
	if !errors.Is(err, ErrNotFound) {
		return data, err
	}
	data, err = create()
	if err != nil {
		return nil, fmt.Errorf("create secret %s: %w", name, err)
	}
	// ON CONFLICT DO NOTHING waits for a concurrent insert of the same name
	// to commit; reading back on the connection that wrote then sees the
	// winner.
	if _, err := v.ex.write.ExecContext(ctx, "INSERT INTO secrets (name, data, create_time) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
		name, data, now()); err != nil {
		return nil, fmt.Errorf("create secret %s: %w", name, err)
	}
	return readSecret(ctx, v.ex.write, name)
}

// GetSecret returns ErrNotFound if name holds no secret.
func (v *view) GetSecret(ctx context.Context, name string) ([]byte, error) {
	if name == "" {
		return nil, fmt.Errorf("secret: name is required: %w", ErrInvalidArgument)
	}
	return readSecret(ctx, v.ex.read, name)
}

func readSecret(ctx context.Context, db dbtx, name string) ([]byte, error) {
	var data []byte
	err := db.QueryRowContext(ctx, "SELECT data FROM secrets WHERE name = $1", name).Scan(&data)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, fmt.Errorf("secret %s: %w", name, ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("secret %s: %w", name, err)
	}
	return data, nil
}

// DeleteSecret removes a secret; ErrNotFound if there was none. Of
// concurrent deletes of one name exactly one succeeds, which makes a
// secret usable once.
func (v *view) DeleteSecret(ctx context.Context, name string) error {
	res, err := v.ex.write.ExecContext(ctx, "DELETE FROM secrets WHERE name = $1", name)
	if err != nil {
		return fmt.Errorf("delete secret %s: %w", name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("delete secret %s: %w", name, err)
	}
	if n == 0 {
		return fmt.Errorf("secret %s: %w", name, ErrNotFound)
	}
	return nil
}

// ListSecrets returns the secrets whose names start with prefix, by name.
func (v *view) ListSecrets(ctx context.Context, prefix string) ([]Secret, error) {
	if prefix == "" {
		return nil, fmt.Errorf("list secrets: prefix is required: %w", ErrInvalidArgument)
	}
	// A range on the primary key rather than LIKE, so no character of the
	// prefix is a pattern and the index serves it on both databases.
	rows, err := v.ex.read.QueryContext(ctx,
		"SELECT name, data, create_time FROM secrets WHERE name >= $1 AND name < $2 ORDER BY name", prefix, prefixEnd(prefix))
	if err != nil {
		return nil, fmt.Errorf("list secrets %s*: %w", prefix, err)
	}
	defer rows.Close()
	var out []Secret
	for rows.Next() {
		var s Secret
		if err := rows.Scan(&s.Name, &s.Data, &s.CreateTime); err != nil {
			return nil, fmt.Errorf("list secrets %s*: %w", prefix, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list secrets %s*: %w", prefix, err)
	}
	return out, nil
}

// prefixEnd is the least string greater than every string starting with
// prefix (prefix has a byte below 0xff: names are text).
func prefixEnd(prefix string) string {
	end := []byte(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return string(end[:i+1])
		}
	}
	return string(end) + "\xff"
}
