package store

import (
	"context"
	"fmt"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// ActorChange is one entry of the actors' history (every transition is
// one, see Tx.AppendEvent), with the actor as it is when read.
type ActorChange struct {
	// Seq orders the history. On SQLite (one writer) entries become
	// visible in Seq order; on PostgreSQL a transaction that took a lower
	// Seq can commit after one that took a higher, so a reader that pages
	// by Seq must look again behind the gaps it saw (server/placements.go).
	Seq      int64
	ActorUID string
	// Actor is the record now; nil when the actor is gone.
	Actor *torporv1.Actor
}

// ChangeFeed reads the actors' history in order, for watchers of
// placements: every replica reads the same history, so any replica can
// resume a watch another began.
type ChangeFeed interface {
	// ActorChanges returns up to limit entries after seq, by Seq.
	ActorChanges(ctx context.Context, after int64, limit int) ([]ActorChange, error)
	// LatestChange is the Seq of the newest entry, 0 when there is none.
	LatestChange(ctx context.Context) (int64, error)
}

func (v *view) ActorChanges(ctx context.Context, after int64, limit int) ([]ActorChange, error) {
	limit = min(max(limit, 1), MaxPageSize)
	rows, err := v.ex.read.QueryContext(ctx, "SELECT seq, actor_uid FROM actor_events WHERE seq > $1 ORDER BY seq LIMIT $2", after, limit)
	if err != nil {
		return nil, fmt.Errorf("actor changes after %d: %w", after, err)
	}
	var changes []ActorChange
	uids := map[string]bool{}
	for rows.Next() {
		var c ActorChange
		if err := rows.Scan(&c.Seq, &c.ActorUID); err != nil {
			rows.Close()
			return nil, fmt.Errorf("actor changes after %d: %w", after, err)
		}
		changes = append(changes, c)
		uids[c.ActorUID] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("actor changes after %d: %w", after, err)
	}
	if len(uids) == 0 {
		return changes, nil
	}
	args := make([]any, 0, len(uids))
	for uid := range uids {
		args = append(args, uid)
	}
	rows, err = v.ex.read.QueryContext(ctx, "SELECT "+recordColumns+" FROM actors WHERE uid IN ("+placeholders(1, len(args))+")", args...)
	if err != nil {
		return nil, fmt.Errorf("actors of changes after %d: %w", after, err)
	}
	actors, err := v.actors.scan(rows)
	if err != nil {
		return nil, fmt.Errorf("actors of changes after %d: %w", after, err)
	}
	byUID := make(map[string]*torporv1.Actor, len(actors))
	for _, a := range actors {
		byUID[a.GetMetadata().GetUid()] = a
	}
	for i := range changes {
		changes[i].Actor = byUID[changes[i].ActorUID]
	}
	return changes, nil
}

func (v *view) LatestChange(ctx context.Context) (int64, error) {
	var seq int64
	if err := v.ex.read.QueryRowContext(ctx, "SELECT COALESCE(MAX(seq), 0) FROM actor_events").Scan(&seq); err != nil {
		return 0, fmt.Errorf("latest actor change: %w", err)
	}
	return seq, nil
}

func (s *sqlStore) ActorChanges(ctx context.Context, after int64, limit int) ([]ActorChange, error) {
	return retriedValue(ctx, func(ctx context.Context) ([]ActorChange, error) { return s.view.ActorChanges(ctx, after, limit) })
}

func (s *sqlStore) LatestChange(ctx context.Context) (int64, error) {
	return retriedValue(ctx, s.view.LatestChange)
}
