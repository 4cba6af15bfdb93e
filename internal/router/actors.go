package router

import (
	"sync"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// actorTable is what this router knows about the actors it routes to: where
// a running one listens (a routing hint only: a dial failure or the TTL
// sends the router back to the control plane) and its traffic, which drives
// the idle policy.
type actorTable struct {
	mu sync.Mutex
	m  map[ActorKey]*actorEntry
}

type actorEntry struct {
	// endpoint is host:port of the running workload, "" when the actor is
	// not known to be RUNNING.
	endpoint   string
	resolvedAt time.Time
	idle       *torporv1.IdlePolicy
	// inflight counts requests being served, streams and upgraded
	// connections included: the actor is busy while it is above zero.
	inflight   int
	lastActive time.Time
	// stopping is closed when the idle action this router started for the
	// actor has finished; requests arriving meanwhile wait for it and then
	// resume the actor.
	stopping chan struct{}
}

func newActorTable() *actorTable { return &actorTable{m: map[ActorKey]*actorEntry{}} }

// enter records a request arriving for key and returns the idle action in
// progress for it, if any.
func (t *actorTable) enter(key ActorKey, now time.Time) (stopping <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	if e == nil {
		e = &actorEntry{}
		t.m[key] = e
	}
	e.inflight++
	e.lastActive = now
	if e.stopping == nil {
		return nil
	}
	return e.stopping
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

// learn records what the control plane said about a RUNNING actor.
func (t *actorTable) learn(key ActorKey, endpoint string, idle *torporv1.IdlePolicy, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	if e == nil {
		// A resume can finish after its requests gave up; keep what it
		// learned so the idle policy still applies to the actor.
		e = &actorEntry{lastActive: now}
		t.m[key] = e
	}
	e.endpoint, e.resolvedAt, e.idle = endpoint, now, idle
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

// idleAction is an idle-policy action the sweep decided to take.
type idleAction struct {
	key    ActorKey
	action torporv1.IdleAction
}

// sweep returns the running actors whose idle period has run out with
// nothing in flight, marking each as stopping (so new requests wait) and
// forgetting its endpoint. It also drops entries that carry no idle
// obligation and whose routing hint has expired, so the table only holds
// actors with recent traffic.
func (t *actorTable) sweep(now time.Time, ttl time.Duration) []idleAction {
	t.mu.Lock()
	defer t.mu.Unlock()
	var due []idleAction
	for key, e := range t.m {
		if e.inflight > 0 || e.stopping != nil {
			continue
		}
		idleFor := now.Sub(e.lastActive)
		policy := e.idle.GetIdleSeconds()
		if e.endpoint != "" && policy > 0 {
			if idleFor >= time.Duration(policy)*time.Second {
				due = append(due, idleAction{key: key, action: e.idle.GetAction()})
				e.stopping = make(chan struct{})
				e.endpoint = ""
			}
			continue
		}
		if idleFor >= ttl {
			delete(t.m, key)
		}
	}
	return due
}

// stopped ends the idle action of key: waiting requests go on (and resume
// the actor), and an entry nobody uses any more is dropped.
func (t *actorTable) stopped(key ActorKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	if e == nil || e.stopping == nil {
		return
	}
	close(e.stopping)
	e.stopping = nil
	if e.inflight == 0 {
		delete(t.m, key)
	}
}
