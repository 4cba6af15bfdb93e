package router

import (
	"sync"
	"time"
)

// actorTable is what this router knows about the actors it routes to: where
// a running one listens (a routing hint only: a dial failure or the TTL
// sends the router back to the control plane) and its traffic, which the
// router reports to the control plane (activity.go).
type actorTable struct {
	mu sync.Mutex
	m  map[ActorKey]*actorEntry
}

type actorEntry struct {
	// endpoint is host:port of the running workload, "" when the actor is
	// not known to be RUNNING.
	endpoint   string
	resolvedAt time.Time
	// inflight counts requests being served, streams and upgraded
	// connections included: the actor is busy while it is above zero.
	inflight   int
	lastActive time.Time
	// reported is the lastActive the control plane has from this router,
	// and reportedInflight the count it has.
	reported         time.Time
	reportedInflight int
}

func newActorTable() *actorTable { return &actorTable{m: map[ActorKey]*actorEntry{}} }

// enter records a request arriving for key. It reports whether the
// control plane must hear of it before the request goes on (syncReport):
// as far as the control plane knows, the actor has been idle for more
// than syncAfter.
func (t *actorTable) enter(key ActorKey, now time.Time) (report bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	if e == nil {
		e = &actorEntry{}
		t.m[key] = e
	}
	e.inflight++
	e.lastActive = now
	return e.reportedInflight == 0 && now.Sub(e.reported) > syncAfter
}

// leave records the end of a request (or stream) for key.
func (t *actorTable) leave(key ActorKey, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[key]; e != nil {
		e.inflight--
		e.lastActive = now
	}
}

// endpoint returns where the actor was last seen running, if that was less
// than ttl ago.
func (t *actorTable) endpoint(key ActorKey, now time.Time, ttl time.Duration) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	if e == nil || e.endpoint == "" || now.Sub(e.resolvedAt) >= ttl {
		return "", false
	}
	return e.endpoint, true
}

// learn records where a RUNNING actor listens.
func (t *actorTable) learn(key ActorKey, endpoint string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	if e == nil {
		// A resume can finish after its requests gave up; the actor is
		// active since.
		e = &actorEntry{lastActive: now}
		t.m[key] = e
	}
	e.endpoint, e.resolvedAt = endpoint, now
}

// forget drops the endpoint of an actor that is not (or no longer) running
// where the router thought.
func (t *actorTable) forget(key ActorKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[key]; e != nil {
		e.endpoint = ""
	}
}

// activity is one actor's line of a report.
type activity struct {
	key        ActorKey
	lastActive time.Time
	inflight   int
}

// unreported returns what the control plane has not heard yet: actors
// active since their last report, and those with requests in flight
// (reported every time, so their count stays fresh).
func (t *actorTable) unreported() []activity {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []activity
	for key, e := range t.m {
		if e.lastActive.After(e.reported) || e.inflight > 0 || e.inflight != e.reportedInflight {
			out = append(out, activity{key: key, lastActive: e.lastActive, inflight: e.inflight})
		}
	}
	return out
}

// reported records what the control plane now has, and drops entries that
// carry nothing left to report and whose routing hint has expired.
func (t *actorTable) markReported(sent []activity, now time.Time, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, a := range sent {
		if e := t.m[a.key]; e != nil {
			if a.lastActive.After(e.reported) {
				e.reported = a.lastActive
			}
			e.reportedInflight = a.inflight
		}
	}
	for key, e := range t.m {
		if e.inflight == 0 && e.reportedInflight == 0 && !e.lastActive.After(e.reported) && now.Sub(e.resolvedAt) >= ttl && now.Sub(e.reported) > syncAfter {
			delete(t.m, key)
		}
	}
}
