package server

import (
	"context"
	"errors"
	"slices"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/httpserve"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// A placement watch reads the actors' history from the store (ChangeFeed),
// not from this replica's memory, so any replica serves any router and a
// router resumes at the version it last applied, on whichever replica it
// reaches. Each watch polls; the history's index makes a poll that finds
// nothing one cheap read, whatever the routers' traffic.
const (
	// placementPoll is how often a watch looks for changes: how late a
	// router may learn a placement it did not ask for itself (one it asked
	// for, a resume, it learns from the answer).
	placementPoll = 100 * time.Millisecond
	// placementHeartbeat: a watch with nothing to say still sends its
	// version this often, so a router tells a quiet watch from a dead one.
	placementHeartbeat = 5 * time.Second
	// placementGapWait is how long a seq missing below ones already read
	// is looked for again before it is taken for a rolled-back
	// transaction (PostgreSQL hands out seqs before commit, and commits
	// do not follow their order).
	placementGapWait = 2 * time.Second
	// placementResumeWindow: a router further behind than this many
	// changes starts over with a reset, which costs one read of the
	// RUNNING actors instead of the whole history since.
	placementResumeWindow = 10000
	placementPage         = store.MaxPageSize
)

// placementService serves PlacementService to routers.
type placementService struct {
	store store.Store
}

func (s *placementService) WatchPlacements(ctx context.Context, req *connect.Request[torporv1.WatchPlacementsRequest], stream *connect.ServerStream[torporv1.PlacementBatch]) error {
	spaces, ok := visibleSpaces(ctx)
	if !ok {
		return connect.NewError(connect.CodeInternal, errors.New("placement watch: the caller was not checked"))
	}
	visible := func(space string) bool { return spaces == nil || slices.Contains(spaces, space) }
	latest, err := s.store.LatestChange(ctx)
	if err != nil {
		return err
	}
	f := newFeed(req.Msg.GetFromVersion())
	if from := f.low; from <= 0 || from > latest || latest-from > placementResumeWindow {
		// A version from another store, or too old to replay: start over.
		// Changes from latest on follow the reset; one the reset already
		// shows comes again, which its actor version makes harmless.
		if err := s.reset(ctx, stream, latest, visible); err != nil {
			return err
		}
		f = newFeed(latest)
	}
	tick := time.NewTicker(placementPoll)
	defer tick.Stop()
	sent := time.Now()
	draining := httpserve.Draining(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-draining:
			return connect.NewError(connect.CodeUnavailable, errors.New("the server is stopping: resume the watch"))
		case <-tick.C:
		}
		changes, err := f.next(ctx, s.store, time.Now())
		if err != nil {
			return err
		}
		batch := &torporv1.PlacementBatch{Version: f.low}
		seen := map[string]bool{}
		for _, c := range slices.Backward(changes) { // the newest entry of each actor is enough
			if seen[c.ActorUID] || (c.Actor != nil && !visible(c.Actor.GetMetadata().GetSpace())) {
				continue
			}
			seen[c.ActorUID] = true
			batch.Placements = append(batch.Placements, placementOf(c))
		}
		if len(batch.Placements) == 0 && time.Since(sent) < placementHeartbeat {
			continue
		}
		if err := stream.Send(batch); err != nil {
			return err
		}
		sent = time.Now()
	}
}

// reset sends every RUNNING actor the caller may see, in batches, the
// first marked replace and the last synced.
func (s *placementService) reset(ctx context.Context, stream *connect.ServerStream[torporv1.PlacementBatch], version int64, visible func(string) bool) error {
	batch := &torporv1.PlacementBatch{Version: version, Replace: true}
	for a, err := range store.All(ctx, s.store.Actors(), store.ListOptions{Filter: store.Filter{"state": "RUNNING"}}) {
		if err != nil {
			return err
		}
		if !visible(a.GetMetadata().GetSpace()) {
			continue
		}
		batch.Placements = append(batch.Placements, placementOf(store.ActorChange{ActorUID: a.GetMetadata().GetUid(), Actor: a}))
		if len(batch.Placements) == placementPage {
			if err := stream.Send(batch); err != nil {
				return err
			}
			batch = &torporv1.PlacementBatch{Version: version}
		}
	}
	batch.Synced = true
	return stream.Send(batch)
}

// placementOf is where the change's actor runs now, or that it does not.
func placementOf(c store.ActorChange) *torporv1.Placement {
	a := c.Actor
	if a == nil {
		return &torporv1.Placement{ActorUid: c.ActorUID}
	}
	m, st := a.GetMetadata(), a.GetStatus()
	p := &torporv1.Placement{Space: m.GetSpace(), Name: m.GetName(), ActorUid: m.GetUid(), ActorVersion: m.GetVersion(), State: st.GetState()}
	if st.GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING {
		p.Worker = st.GetWorker()
		p.Port = validate.WorkloadPort(st.GetCurrentTemplateSpec())
	}
	return p
}

// feed reads the history in order for one watch, looking again behind
// the gaps it saw (see placementGapWait).
type feed struct {
	// low: every change up to it was sent or given up for rolled back;
	// the version a router resumes from.
	low int64
	// sent are the changes above low already sent.
	sent map[int64]bool
	// gaps are the seqs above low not read yet, since when they are
	// missing.
	gaps map[int64]time.Time
}

func newFeed(low int64) *feed {
	return &feed{low: low, sent: map[int64]bool{}, gaps: map[int64]time.Time{}}
}

// next returns the changes not sent yet, in order, and moves low up.
func (f *feed) next(ctx context.Context, st store.ChangeFeed, now time.Time) ([]store.ActorChange, error) {
	var out []store.ActorChange
	high := f.low
	for {
		page, err := st.ActorChanges(ctx, high, placementPage)
		if err != nil {
			return nil, err
		}
		for _, c := range page {
			if !f.sent[c.Seq] {
				out = append(out, c)
				f.sent[c.Seq] = true
			}
			delete(f.gaps, c.Seq)
			high = c.Seq
		}
		if len(page) < placementPage {
			break
		}
	}
	for seq := f.low + 1; seq < high; seq++ {
		if _, known := f.gaps[seq]; !known && !f.sent[seq] {
			f.gaps[seq] = now
		}
	}
	for {
		next := f.low + 1
		if f.sent[next] {
			delete(f.sent, next)
		} else if since, ok := f.gaps[next]; ok && now.Sub(since) > placementGapWait {
			delete(f.gaps, next)
		} else {
			return out, nil
		}
		f.low = next
	}
}
