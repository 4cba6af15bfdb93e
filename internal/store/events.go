package store

import (
	"context"
	"fmt"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

const eventColumns = "actor_uid, time, from_state, to_state, reason, operation_id, worker, duration_ns"

// AppendEvent stores ev; a zero Time means now.
func (v *view) AppendEvent(ctx context.Context, ev Event) error {
	if ev.ActorUID == "" {
		return fmt.Errorf("append event: actor uid is required: %w", ErrInvalidArgument)
	}
	t := ev.Time.UTC().Truncate(time.Microsecond)
	if ev.Time.IsZero() {
		t = now()
	}
	// Nothing reads the insert's result: in a transaction on PostgreSQL
	// it goes out with the next statement or the commit (pgpipeline.go).
	_, err := v.ex.write.ExecContext(deferrable(ctx),
		"INSERT INTO actor_events ("+eventColumns+") VALUES ("+placeholders(1, 8)+")",
		ev.ActorUID, t, ev.FromState.String(), ev.ToState.String(), ev.Reason, ev.OperationID, ev.Worker, int64(ev.Duration))
	if err != nil {
		return fmt.Errorf("append event of actor %s: %w", ev.ActorUID, err)
	}
	return nil
}

// Events returns the actor's history oldest first; with limit > 0, only
// its latest limit entries.
func (v *view) Events(ctx context.Context, actorUID string, limit int) ([]Event, error) {
	query := "SELECT " + eventColumns + " FROM actor_events WHERE actor_uid = $1 ORDER BY seq"
	args := []any{actorUID}
	if limit > 0 {
		query = "SELECT " + eventColumns + " FROM (SELECT seq, " + eventColumns +
			" FROM actor_events WHERE actor_uid = $1 ORDER BY seq DESC LIMIT $2) AS latest ORDER BY seq"
		args = append(args, limit)
	}
	rows, err := v.ex.read.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("events of actor %s: %w", actorUID, err)
	}
	defer rows.Close()
	var events []Event
	for rows.Next() {
		var (
			ev       Event
			from, to string
			duration int64
		)
		if err := rows.Scan(&ev.ActorUID, &ev.Time, &from, &to, &ev.Reason, &ev.OperationID, &ev.Worker, &duration); err != nil {
			return nil, fmt.Errorf("events of actor %s: %w", actorUID, err)
		}
		ev.Time = ev.Time.UTC()
		ev.FromState = torporv1.ActorState(torporv1.ActorState_value[from])
		ev.ToState = torporv1.ActorState(torporv1.ActorState_value[to])
		ev.Duration = time.Duration(duration)
		events = append(events, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("events of actor %s: %w", actorUID, err)
	}
	return events, nil
}
