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

// noFreeWorker is a placement (a resume's claim, a golden build) finding
// no free worker that fits; it carries what is needed, so an eviction can
// find a busy worker that would. It unwraps to the answer to give.
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
// actor of the lowest eviction priority, frozen ones first, then the
// least recently active,
// among those on a worker that fits a, idle for at least their
// template's minimum, with no request in flight, not opted out and no E2B
// sandbox (its lease keeps it). The stop's finalize reserves the worker
// for a (WorkerStatus), so no other resume takes it, and concurrent
// resumes each evict their own victim: a victim's claim is a
// compare-and-set that only one of them wins. It
// returns nil once a victim is stopped (or its stop failed, which may
// free its worker too: the caller's claim decides), and
// ResourceExhausted, naming why, when nothing can be evicted. a may be a
// golden build's stand-in (goldenActorPrefix, the template's uid).
func (e *Engine) evictFor(ctx context.Context, a *torporv1.Actor, full *noFreeWorker) error {
	start := e.now()
	workers, err := store.ListAll(ctx, e.store.Workers(), store.ListOptions{})
	if err != nil {
		return fmt.Errorf("find an actor to evict for actor %s: %w", actorKey(a), err)
	}
	busy := slices.DeleteFunc(workers, func(w *torporv1.Worker) bool { return w.GetStatus().GetActor().GetUid() == "" })
	var cands []evictionCandidate
	why := "no busy worker fits it either"
	if fit, err := scheduler.Fits(busy, full.live, full.req); err == nil {
		if cands, why, err = e.evictionCandidates(ctx, fit); err != nil {
			return fmt.Errorf("find an actor to evict for actor %s: %w", actorKey(a), err)
		}
	}
	for _, c := range cands {
		idleFor := start.Sub(c.act.LastActive).Round(time.Millisecond)
		_, err := e.stopIdle(ctx, c.actor, c.p.kind, stopCause{
			reason: fmt.Sprintf("evicted for %s, which found no free worker: first in eviction order (priority %d, then frozen, then least recently active; idle %s%s)",
				actorKey(a), c.p.priority, idleFor, frozenNote(c.actor)),
			metric:     "eviction",
			cutoff:     start.Add(-c.p.minIdle),
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
	if len(cands) > 0 {
		why = "every candidate became busy or was taken by another resume"
	}
	return noEvictable(a, full.cause, why)
}

// evictionCandidates returns the evictable actors of the busy workers
// fit, in eviction order, or why there is none.
func (e *Engine) evictionCandidates(ctx context.Context, fit []*torporv1.Worker) ([]evictionCandidate, string, error) {
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
	never, inFlight, recent, leased := 0, 0, 0, 0
	for _, a := range running {
		c := evictionCandidate{actor: a, p: policyOf(a.GetStatus().GetCurrentTemplateSpec()), act: acts[a.GetMetadata().GetUid()]}
		switch {
		case isSandbox(a):
			// Its lease keeps it; the lease's end stops it (leases.go).
			leased++
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
	// Within a priority, frozen actors go first (the idle ladder's next
	// rung), then the least recently active.
	frozen := func(c evictionCandidate) int {
		if c.actor.GetStatus().GetFrozenTime() != nil {
			return 0
		}
		return 1
	}
	slices.SortFunc(cands, func(x, y evictionCandidate) int {
		return cmp.Or(cmp.Compare(x.p.priority, y.p.priority), cmp.Compare(frozen(x), frozen(y)), x.act.LastActive.Compare(y.act.LastActive))
	})
	var why []string
	for _, n := range []struct {
		n    int
		what string
	}{{inFlight, "serving requests"}, {recent, "active more recently than their templates' eviction minimum"}, {never, "never evicted by their templates"}, {leased, "E2B sandboxes, kept until their lease ends"}} {
		if n.n > 0 {
			why = append(why, fmt.Sprintf("%d %s", n.n, n.what))
		}
	}
	return cands, fmt.Sprintf("of the %d running actors on workers that fit: %s", len(running), strings.Join(why, ", ")), nil
}

// keepHeadroom evicts early, so a resume rarely waits for an eviction:
// in each pool with a headroom (Options.Headroom) and fewer free workers
// on live nodes than that, it stops as many evictable actors as are
// missing, in eviction order. A worker being freed by a step in flight
// counts as free. Replicas sweeping at the same moment may each stop one,
// freeing more than asked; the next sweeps stop none until it is used.
func (e *Engine) keepHeadroom(ctx context.Context) error {
	if len(e.opts.Headroom) == 0 {
		return nil
	}
	workers, err := store.ListAll(ctx, e.store.Workers(), store.ListOptions{})
	if err != nil {
		return err
	}
	live, err := e.placeableNodes(ctx)
	if err != nil {
		return err
	}
	freeing, err := e.freeing(ctx)
	if err != nil {
		return err
	}
	now := e.now()
	free, busy := map[string]int{}, map[string][]*torporv1.Worker{}
	for _, w := range workers {
		pool := w.GetSpec().GetPool()
		switch {
		case e.opts.Headroom[pool] == 0 || !live(w.GetSpec().GetNode()):
		case w.GetStatus().GetActor().GetUid() == "" && !scheduler.Reserved(w, "", now), freeing[w.GetStatus().GetActor().GetUid()]:
			free[pool]++
		case w.GetStatus().GetActor().GetUid() != "":
			busy[pool] = append(busy[pool], w)
		}
	}
	var errs []error
	for pool, want := range e.opts.Headroom {
		missing := want - free[pool]
		if missing <= 0 || len(busy[pool]) == 0 {
			continue
		}
		cands, _, err := e.evictionCandidates(ctx, busy[pool])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, c := range cands {
			if missing == 0 {
				break
			}
			_, err := e.stopIdle(ctx, c.actor, c.p.kind, stopCause{
				reason: fmt.Sprintf("headroom: pool %s keeps %d workers free and had %d; the least recently active evictable actor (idle %s)",
					pool, want, free[pool], now.Sub(c.act.LastActive).Round(time.Millisecond)),
				metric: "headroom",
				cutoff: now.Add(-c.p.minIdle),
			})
			switch {
			case err == nil:
				missing--
			case errors.Is(err, errRetry), errors.Is(err, errStopCancelled):
			default:
				errs = append(errs, fmt.Errorf("headroom of pool %s: stop actor %s: %w", pool, actorKey(c.actor), err))
			}
		}
	}
	return errors.Join(errs...)
}

// freeing returns the uids of actors whose suspend or pause is in flight:
// their workers are about to be free.
func (e *Engine) freeing(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	for _, state := range []torporv1.ActorState{torporv1.ActorState_ACTOR_STATE_SUSPENDING, torporv1.ActorState_ACTOR_STATE_PAUSING} {
		actors, err := store.ListAll(ctx, e.store.Actors(), store.ListOptions{Filter: store.Filter{"state": state.String()}})
		if err != nil {
			return nil, err
		}
		for _, a := range actors {
			out[a.GetMetadata().GetUid()] = true
		}
	}
	return out, nil
}

// frozenNote says, in an eviction's reason, that the victim was frozen.
func frozenNote(a *torporv1.Actor) string {
	if a.GetStatus().GetFrozenTime() == nil {
		return ""
	}
	return ", frozen"
}
