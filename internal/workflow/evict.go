package workflow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/scheduler"
	"github.com/torpor-dev/torpor/internal/store"
)

// noFreeWorker is a resume's claim finding no free worker that fits the
// actor; it carries what the actor needs, so an eviction can find a busy
// worker that would. It unwraps to the ResourceExhausted answer.
type noFreeWorker struct {
	live func(string) bool
	req  scheduler.Request
	// cause is the scheduler's reason.
	cause error
	err   error
}

func (n *noFreeWorker) Error() string { return n.err.Error() }
func (n *noFreeWorker) Unwrap() error { return n.err }

// evictionCandidate is a RUNNING actor on a worker that fits the actor
// waiting for one.
type evictionCandidate struct {
	actor *torporv1.Actor
	p     policy
	act   Activity
}

// evictFor frees a worker for a, whose resume found none free (DESIGN
// invariant 10): it pauses or suspends, per its idle policy, the RUNNING
// actor of the lowest eviction priority, least recently active first,
// among those on a worker that fits a, idle for at least their
// template's minimum, with no request in flight and not opted out. The
// stop's finalize reserves the worker for a (WorkerStatus), so no other
// resume takes it, and concurrent resumes each evict their own victim:
// a victim's claim is a compare-and-set that only one of them wins. It
// returns nil once a victim is stopped (or its stop failed, which may
// free its worker too: the caller's claim decides), and
// ResourceExhausted, naming why, when nothing can be evicted.
func (e *Engine) evictFor(ctx context.Context, a *torporv1.Actor, full *noFreeWorker) error {
	start := e.now()
	cands, why, err := e.evictionCandidates(ctx, full)
	if err != nil {
		return fmt.Errorf("find an actor to evict for actor %s: %w", actorKey(a), err)
	}
	for _, c := range cands {
		idleFor := start.Sub(c.act.LastActive).Round(time.Millisecond)
		_, err := e.stopIdle(ctx, c.actor, c.p.kind, stopCause{
			reason:     fmt.Sprintf("evicted for %s, which found no free worker: the least recently active evictable actor (idle %s)", actorKey(a), idleFor),
			metric:     "eviction",
			cutoff:     start.Add(-c.p.minIdle),
			idleFor:    idleFor,
			evictedFor: a,
		})
		switch {
		case err == nil:
			e.metrics.evictionWait.Observe(e.now().Sub(start).Seconds())
			e.logger(a).Info("evicted an actor for a resume", "victim", actorKey(c.actor), "victim_idle", idleFor, "wait", e.now().Sub(start))
			return nil
		case errors.Is(err, errRetry), errors.Is(err, errStopCancelled):
			continue // another resume or a request took it first
		case ctx.Err() != nil:
			return err
		default:
			// The victim crashed or stayed RUNNING; a crash freed its
			// worker, which the caller's claim may find.
			e.logger(c.actor).Warn("eviction failed", "for", actorKey(a), "err", err)
			return nil
		}
	}
	e.metrics.noEvictable.Inc()
	if len(cands) > 0 {
		why = "every candidate became busy or was taken by another resume"
	}
	return noEvictable(a, full.cause, why)
}

// evictionCandidates returns the evictable actors on busy workers that
// fit full's request, in eviction order, or why there is none.
func (e *Engine) evictionCandidates(ctx context.Context, full *noFreeWorker) ([]evictionCandidate, string, error) {
	workers, err := listAll(ctx, e.store.Workers(), store.ListOptions{})
	if err != nil {
		return nil, "", err
	}
	busy := slices.DeleteFunc(workers, func(w *torporv1.Worker) bool { return w.GetStatus().GetActor().GetUid() == "" })
	fit, err := scheduler.Fits(busy, full.live, full.req)
	if err != nil || len(fit) == 0 {
		return nil, "no busy worker fits it either", nil
	}
	var running []*torporv1.Actor
	for _, w := range fit {
		ref := w.GetStatus().GetActor()
		a, err := e.store.Actors().Get(ctx, ref.GetSpace(), ref.GetName())
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, "", err
		}
		// Only an actor RUNNING on this very worker (invariant 1): one
		// already stopping frees its worker by itself.
		if a.GetMetadata().GetUid() == ref.GetUid() && a.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING &&
			a.GetStatus().GetWorker().GetUid() == w.GetMetadata().GetUid() {
			running = append(running, a)
		}
	}
	if len(running) == 0 {
		return nil, fmt.Sprintf("the %d busy workers that fit are changing hands", len(fit)), nil
	}
	acts, err := e.ActivityOf(ctx, running)
	if err != nil {
		return nil, "", err
	}
	now := e.now()
	var cands []evictionCandidate
	never, inFlight, recent := 0, 0, 0
	for _, a := range running {
		c := evictionCandidate{actor: a, p: policyOf(a.GetStatus().GetCurrentTemplateSpec()), act: acts[a.GetMetadata().GetUid()]}
		switch {
		case c.p.never:
			never++
		case c.act.InFlight > 0:
			inFlight++
		case c.act.busy(now.Add(-c.p.minIdle)):
			recent++
		default:
			cands = append(cands, c)
		}
	}
	slices.SortFunc(cands, func(x, y evictionCandidate) int {
		return cmp.Or(cmp.Compare(x.p.priority, y.p.priority), x.act.LastActive.Compare(y.act.LastActive))
	})
	var why []string
	for _, n := range []struct {
		n    int
		what string
	}{{inFlight, "serving requests"}, {recent, "active more recently than their templates' eviction minimum"}, {never, "never evicted by their templates"}} {
		if n.n > 0 {
			why = append(why, fmt.Sprintf("%d %s", n.n, n.what))
		}
	}
	return cands, fmt.Sprintf("of the %d running actors on workers that fit: %s", len(running), strings.Join(why, ", ")), nil
}
