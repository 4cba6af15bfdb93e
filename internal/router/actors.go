package router

import (
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/internal/slotgate"
)

// actorTable is what this router knows about the actors it routes to:
// where a running one is reached (from the placement watch, a resume's or
// a read's answer) and its traffic, which the router reports to the
// control plane (activity.go). A placement is a hint the node's slot gate
// checks on every connection: one gone stale is refused there, never
// delivered to another actor, and the router then asks the control plane.
type actorTable struct {
	mu sync.Mutex
	m  map[ActorKey]*actorEntry
	// gen counts the watch's resets; a reset ends with dropping the
	// placements it did not confirm (synced).
	gen uint64
}

// placement is where a RUNNING actor's workload is reached: through its
// node's slot gate, for the actor's uid only.
type placement struct {
	// version is the actor record's: of two placements of one actor, the
	// newer wins.
	version int64
	target  slotgate.Target
}

// poolKey names the proxy's keep-alive connections to the placement: one
// pool per actor, worker and port, never shared with another actor.
func (p placement) poolKey() string {
	return net.JoinHostPort(p.target.ActorUID+"."+p.target.Worker, strconv.Itoa(p.target.Port))
}

type actorEntry struct {
	// at is where the actor runs, nil when it is not known to be RUNNING.
	at *placement
	// uid and version name the newest record of the actor the table has
	// heard of, so a placement older than a stop it saw is not taken.
	uid     string
	version int64
	// gen is the reset that last confirmed at.
	gen uint64
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

// placement returns where the actor was last known to run.
func (t *actorTable) placement(key ActorKey) (placement, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	if e == nil || e.at == nil {
		return placement{}, false
	}
	return *e.at, true
}

// learn records where a RUNNING actor runs, unless the table knows a
// newer placement of it.
func (t *actorTable) learn(key ActorKey, p placement) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	if e == nil {
		e = &actorEntry{}
		t.m[key] = e
	}
	if e.newer(p.target.ActorUID, p.version) {
		e.at = &p
	}
	e.gen = t.gen
}

// newer reports whether version of actor uid is not older than what the
// entry heard of, and records it. Another uid (an actor of the same name
// created again) is newer.
func (e *actorEntry) newer(uid string, version int64) bool {
	if e.uid == uid && version < e.version {
		return false
	}
	e.uid, e.version = uid, version
	return true
}

// stopped records that the actor of uid, of record version, does not run
// (any more) where the table may say.
func (t *actorTable) stopped(key ActorKey, uid string, version int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[key]; e != nil && e.newer(uid, version) {
		e.at = nil
	}
}

// gone drops the placement of a deleted actor.
func (t *actorTable) gone(uid string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.m {
		if e.at != nil && e.at.target.ActorUID == uid {
			e.at = nil
		}
	}
}

// forget drops a placement the gate refused, unless the table learned a
// newer one meanwhile.
func (t *actorTable) forget(key ActorKey, stale placement) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[key]; e != nil && e.at != nil && *e.at == stale {
		e.at = nil
	}
}

// reset begins replacing every placement: the ones not learned again by
// synced are dropped.
func (t *actorTable) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen++
}

func (t *actorTable) synced() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.m {
		if e.gen != t.gen {
			e.at = nil
		}
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

// markReported records what the control plane now has, and drops entries
// that carry nothing left to report and no placement.
func (t *actorTable) markReported(sent []activity, now time.Time) {
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
		if e.at == nil && e.inflight == 0 && e.reportedInflight == 0 && !e.lastActive.After(e.reported) && now.Sub(e.reported) > syncAfter {
			delete(t.m, key)
		}
	}
}
