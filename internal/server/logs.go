package server

// An actor's log is read where it is, never by waking the actor
// (DESIGN invariant 12): from the node running it (the only source that
// can be followed), from the node that keeps it after the workload
// stopped there (a crash, with its last output; a pause), or from the
// actor's latest snapshot in storage, which carries the log as the
// checkpoint left it. A follow goes on across suspends, resumes and
// moves: when one node's stream ends, it waits for the actor to run
// again, wherever, and goes on from the last record it sent.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/actorlog"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
)

const (
	// followPoll is how often a follow between two runs of the actor
	// reads its record.
	followPoll = 500 * time.Millisecond
	// followOverlap: a follow that goes on from another stream asks for
	// the records from this long before the last one it sent (records of
	// the streams of one node are stamped as they are read, so one can be
	// a little older than another's already sent) and leaves out those it
	// sent.
	followOverlap = 2 * time.Second
	// logBatch bounds the records of one message read from storage.
	logBatch = 500
)

// GetActorLogs streams the actor's log from where it is, and with follow
// goes on until the actor is deleted or the caller leaves.
func (s *actorService) GetActorLogs(ctx context.Context, req *connect.Request[torporv1.GetActorLogsRequest], stream *connect.ServerStream[torporv1.GetActorLogsResponse]) error {
	m := req.Msg
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return err
	}
	if m.GetTail() < 0 {
		return invalidArgument("tail", "must not be negative")
	}
	a, err := s.store.Actors().Get(ctx, m.GetSpace(), m.GetName())
	if err != nil {
		return errdefs.ToConnect(err)
	}
	c := &logCursor{since: m.GetSince().AsTime(), sent: map[string]time.Time{}, stream: stream}
	if m.GetSince() == nil {
		c.since = time.Time{}
	}
	tail := m.GetTail()
	for {
		if err := s.readLog(ctx, a, m, tail, c); err != nil {
			return err
		}
		if !m.GetFollow() {
			return nil
		}
		tail = 0
		if a, err = s.awaitRun(ctx, a); a == nil || err != nil {
			return err
		}
	}
}

// readLog sends a's log from where it is, after what c sent; from the
// node running the actor, with follow, to the end of that run there.
func (s *actorService) readLog(ctx context.Context, a *torporv1.Actor, m *torporv1.GetActorLogsRequest, tail int32, c *logCursor) error {
	st := a.GetStatus()
	uid := a.GetMetadata().GetUid()
	node := &torporv1.LogsRequest{ActorUid: uid, Container: m.GetContainer(), Since: c.next(), Tail: tail}
	if w := st.GetWorker(); w != nil && st.GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING {
		node.Worker, node.Follow = w.GetName(), m.GetFollow()
		err := s.relayNodeLog(ctx, a, w.GetNode(), node, c)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if connect.CodeOf(err) != connect.CodeFailedPrecondition && connect.CodeOf(err) != connect.CodeNotFound {
			return err
		}
		// It left the worker since it was read: its log is elsewhere
		// now.
		if a, err = s.store.Actors().Get(ctx, a.GetMetadata().GetSpace(), a.GetMetadata().GetName()); err != nil {
			return errdefs.ToConnect(err)
		}
		st = a.GetStatus()
	}
	// A node that keeps the log after the workload stopped there holds
	// more than the snapshot: a crash's last output, a pause's records.
	if keeper := s.logKeeper(ctx, a); keeper != "" {
		node.Worker, node.Follow = "", false
		err := s.relayNodeLog(ctx, a, keeper, node, c)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		// Out of reach, or it let the log go: the snapshot holds the
		// log up to the checkpoint.
	}
	return s.sendStoredLog(ctx, a, st.GetLatestSnapshot(), m.GetContainer(), tail, c)
}

// logKeeper is the node that keeps a's log after its workload stopped
// there: the one that ran it when it crashed, the one holding a pause's
// checkpoint; "" if none.
func (s *actorService) logKeeper(ctx context.Context, a *torporv1.Actor) string {
	st := a.GetStatus()
	switch st.GetState() {
	case torporv1.ActorState_ACTOR_STATE_CRASHED:
		return st.GetLastWorker().GetNode()
	case torporv1.ActorState_ACTOR_STATE_PAUSED:
		snap, err := s.store.Snapshots().Get(ctx, a.GetMetadata().GetSpace(), st.GetLocalCheckpoint())
		if err != nil {
			return ""
		}
		return snap.GetNode()
	}
	return ""
}

// relayNodeLog sends what node answers to req, after what c sent.
func (s *actorService) relayNodeLog(ctx context.Context, a *torporv1.Actor, node string, req *torporv1.LogsRequest, c *logCursor) error {
	agent, err := s.agents.client(ctx, node)
	if err != nil {
		return errdefs.ToConnect(err)
	}
	logs, err := agent.Logs(ctx, connect.NewRequest(req))
	if err != nil {
		return dataPlaneError("logs of", a, err)
	}
	defer logs.Close()
	for logs.Receive() {
		if err := c.send(logs.Msg().GetRecords()); err != nil {
			return err
		}
	}
	if err := logs.Err(); err != nil {
		return dataPlaneError("logs of", a, err)
	}
	return nil
}

// sendStoredLog sends the log that snapshot snap of a carries ("" or a
// snapshot without one: none).
func (s *actorService) sendStoredLog(ctx context.Context, a *torporv1.Actor, snap, container string, tail int32, c *logCursor) error {
	if snap == "" {
		return nil
	}
	rec, err := s.store.Snapshots().Get(ctx, a.GetMetadata().GetSpace(), snap)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return errdefs.ToConnect(err)
	}
	dir, err := os.MkdirTemp("", "torpor-log-")
	if err != nil {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("logs of actor %s/%s: %w", a.GetMetadata().GetSpace(), a.GetMetadata().GetName(), err))
	}
	defer os.RemoveAll(dir)
	if err := snapshot.DownloadPart(ctx, s.objects, rec.GetLocation(), rec.GetManifestDigest(), actorlog.Dir, dir); err != nil {
		return errdefs.ToConnect(fmt.Errorf("logs of actor %s/%s from snapshot %s: %w", a.GetMetadata().GetSpace(), a.GetMetadata().GetName(), snap, err))
	}
	f := actorlog.Filter{Container: container}
	if since := c.next(); since != nil {
		f.Since = since.AsTime()
	}
	var recs []*torporv1.LogRecord
	for _, name := range actorlog.Files {
		b, err := os.ReadFile(filepath.Join(dir, actorlog.Dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("logs of actor %s/%s: %w", a.GetMetadata().GetSpace(), a.GetMetadata().GetName(), err))
		}
		recs = actorlog.Parse(recs, b, f)
	}
	for batch := range slices.Chunk(actorlog.LastLines(recs, int(tail)), logBatch) {
		if err := c.send(batch); err != nil {
			return err
		}
	}
	return nil
}

// awaitRun waits until a runs (again: a follow that reached the end of
// one node's stream starts over on the node running the actor then), and
// returns it; nil when it is gone or the caller left.
func (s *actorService) awaitRun(ctx context.Context, a *torporv1.Actor) (*torporv1.Actor, error) {
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, nil
		case <-tick.C:
		}
		cur, err := s.store.Actors().Get(ctx, a.GetMetadata().GetSpace(), a.GetMetadata().GetName())
		switch {
		case errors.Is(err, store.ErrNotFound), ctx.Err() != nil:
			return nil, nil
		case err != nil:
			// The store comes back; the follow waits for it.
			continue
		case cur.GetMetadata().GetUid() != a.GetMetadata().GetUid():
			// Deleted, and another actor has its name.
			return nil, nil
		}
		if st := cur.GetStatus(); st.GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING && st.GetWorker() != nil {
			return cur, nil
		}
	}
}

// logCursor sends records once across the streams of one read: a
// follow's next stream starts a little before the last record sent
// (followOverlap), and what was sent is left out.
type logCursor struct {
	since  time.Time // the caller's --since
	latest time.Time // of the last record sent
	sent   map[string]time.Time
	stream *connect.ServerStream[torporv1.GetActorLogsResponse]
}

// next is the time the next stream starts at; nil: from the beginning.
func (c *logCursor) next() *timestamppb.Timestamp {
	t := c.since
	if from := c.latest.Add(-followOverlap); !c.latest.IsZero() && from.After(t) {
		t = from
	}
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// send sends the records of recs not sent yet.
func (c *logCursor) send(recs []*torporv1.LogRecord) error {
	fresh := recs[:0:0]
	for _, r := range recs {
		k := string(actorlog.Encode(r))
		if _, dup := c.sent[k]; dup {
			continue
		}
		t := r.GetTime().AsTime()
		c.sent[k] = t
		if t.After(c.latest) {
			c.latest = t
		}
		fresh = append(fresh, r)
	}
	c.forget()
	if len(fresh) == 0 {
		return nil
	}
	return c.stream.Send(&torporv1.GetActorLogsResponse{Records: fresh})
}

// forget drops what no next stream can send again.
func (c *logCursor) forget() {
	if len(c.sent) < 4*logBatch {
		return
	}
	for k, t := range c.sent {
		if t.Before(c.latest.Add(-followOverlap)) {
			delete(c.sent, k)
		}
	}
}
