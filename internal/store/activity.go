package store

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Activity is one reporter's account of an actor's traffic: the idle
// policy and eviction go by it. It lives apart from the actor record so a
// report never bumps the actor's version.
type Activity struct {
	Space, Name string
	// Reporter is who counts InFlight: a router's name, or the API.
	Reporter   string
	LastActive time.Time
	// InFlight is the requests the reporter was serving at ReportTime.
	InFlight int
	// ReportTime is when the store received the report (set by the store).
	ReportTime time.Time
}

// ActivityKey names an actor in the activity records.
type ActivityKey struct{ Space, Name string }

// ActivityLog keeps actors' activity reports, shared by every replica.
type ActivityLog interface {
	// RecordActivity stores reports in one statement per few hundred: per
	// (actor, reporter) the latest LastActive wins (it never moves back)
	// and InFlight is replaced; ReportTime becomes now.
	RecordActivity(ctx context.Context, reports []Activity) error
	// ActivityOf returns every reporter's record of the given actors.
	ActivityOf(ctx context.Context, keys []ActivityKey) ([]Activity, error)
	// PruneActivity removes records last reported before t and returns how
	// many it removed.
	PruneActivity(ctx context.Context, before time.Time) (int64, error)
}

// activityChunk bounds the rows of one statement (SQLite allows 32766
// parameters; PostgreSQL 65535).
const activityChunk = 500

func (v *view) RecordActivity(ctx context.Context, reports []Activity) error {
	// One row per key: PostgreSQL refuses an upsert that touches a row
	// twice.
	type key struct{ space, name, reporter string }
	merged := map[key]int{}
	var rows []Activity
	for _, r := range reports {
		if r.Space == "" || r.Name == "" || r.Reporter == "" {
			return fmt.Errorf("record activity of %s/%s by %q: space, name and reporter are required: %w", r.Space, r.Name, r.Reporter, ErrInvalidArgument)
		}
		k := key{r.Space, r.Name, r.Reporter}
		if i, ok := merged[k]; ok {
			rows[i].LastActive = later(rows[i].LastActive, r.LastActive)
			rows[i].InFlight = r.InFlight
			continue
		}
		merged[k] = len(rows)
		rows = append(rows, r)
	}
	t := now()
	for len(rows) > 0 {
		n := min(len(rows), activityChunk)
		values := make([]string, n)
		args := make([]any, 0, 6*n)
		for i, r := range rows[:n] {
			values[i] = "(" + placeholders(6*i+1, 6) + ")"
			args = append(args, r.Space, r.Name, r.Reporter, r.LastActive.UTC().Truncate(time.Microsecond), int64(r.InFlight), t)
		}
		_, err := v.ex.write.ExecContext(ctx, "INSERT INTO actor_activity (space, name, reporter, last_active, in_flight, report_time) VALUES "+
			strings.Join(values, ", ")+
			" ON CONFLICT (space, name, reporter) DO UPDATE SET"+
			" last_active = CASE WHEN excluded.last_active > actor_activity.last_active THEN excluded.last_active ELSE actor_activity.last_active END,"+
			" in_flight = excluded.in_flight, report_time = excluded.report_time", args...)
		if err != nil {
			return fmt.Errorf("record activity of %d actors: %w", n, err)
		}
		rows = rows[n:]
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (v *view) ActivityOf(ctx context.Context, keys []ActivityKey) ([]Activity, error) {
	var out []Activity
	for len(keys) > 0 {
		n := min(len(keys), activityChunk)
		conds := make([]string, n)
		args := make([]any, 0, 2*n)
		for i, k := range keys[:n] {
			conds[i] = fmt.Sprintf("(space = $%d AND name = $%d)", 2*i+1, 2*i+2)
			args = append(args, k.Space, k.Name)
		}
		rows, err := v.ex.read.QueryContext(ctx, "SELECT space, name, reporter, last_active, in_flight, report_time FROM actor_activity WHERE "+strings.Join(conds, " OR "), args...)
		if err != nil {
			return nil, fmt.Errorf("activity of %d actors: %w", n, err)
		}
		for rows.Next() {
			var a Activity
			var inFlight int64
			if err := rows.Scan(&a.Space, &a.Name, &a.Reporter, &a.LastActive, &inFlight, &a.ReportTime); err != nil {
				rows.Close()
				return nil, fmt.Errorf("activity of %d actors: %w", n, err)
			}
			a.InFlight, a.LastActive, a.ReportTime = int(inFlight), a.LastActive.UTC(), a.ReportTime.UTC()
			out = append(out, a)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("activity of %d actors: %w", n, err)
		}
		keys = keys[n:]
	}
	return out, nil
}

func (v *view) PruneActivity(ctx context.Context, before time.Time) (int64, error) {
	res, err := v.ex.write.ExecContext(ctx, "DELETE FROM actor_activity WHERE report_time < $1", before.UTC().Truncate(time.Microsecond))
	if err != nil {
		return 0, fmt.Errorf("prune activity reported before %s: %w", before.Format(time.RFC3339), err)
	}
	return res.RowsAffected()
}

func (s *sqlStore) RecordActivity(ctx context.Context, reports []Activity) error {
	return retried(ctx, func(ctx context.Context) error { return s.view.RecordActivity(ctx, reports) })
}

func (s *sqlStore) ActivityOf(ctx context.Context, keys []ActivityKey) ([]Activity, error) {
	return retriedValue(ctx, func(ctx context.Context) ([]Activity, error) { return s.view.ActivityOf(ctx, keys) })
}

func (s *sqlStore) PruneActivity(ctx context.Context, before time.Time) (int64, error) {
	return retriedValue(ctx, func(ctx context.Context) (int64, error) { return s.view.PruneActivity(ctx, before) })
}
