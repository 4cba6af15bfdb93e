package workflow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// The idle policy of a template that sets none, and the eviction minimum
// of one that sets none (IdlePolicy in resources.proto).
const (
	DefaultIdleSeconds    = 600
	DefaultMinIdleSeconds = 2
)

// APIReporter is the reporter of activity the API itself records (a
// resume, suspend or pause asked for through it).
const APIReporter = "api"

// activityStale: an in-flight count reported longer ago than this is not
// believed; its reporter (a router reporting every second) may be gone.
const activityStale = 10 * time.Second

// policy is an actor's idle policy with its defaults applied.
type policy struct {
	// idle is the idle time before the idle action; 0: never.
	idle time.Duration
	// kind is what the idle action and an eviction do.
	kind checkpointKind
	// never: the actor is never evicted.
	never    bool
	minIdle  time.Duration
	priority int32
}

// policyOf reads the idle policy of the spec a guest runs. An absent
// IdlePolicy is the default; one present with idle_seconds 0 is never.
func policyOf(spec *torporv1.TemplateSpec) policy {
	ip := spec.GetIdlePolicy()
	p := policy{idle: DefaultIdleSeconds * time.Second, kind: suspendKind, minIdle: DefaultMinIdleSeconds * time.Second}
	if ip == nil {
		return p
	}
	p.idle = time.Duration(ip.GetIdleSeconds()) * time.Second
	if ip.GetAction() == torporv1.IdleAction_IDLE_ACTION_PAUSE {
		p.kind = pauseKind
	}
	ev := ip.GetEviction()
	p.never, p.priority = ev.GetNever(), ev.GetPriority()
	if s := ev.GetMinIdleSeconds(); s > 0 {
		p.minIdle = time.Duration(s) * time.Second
	}
	return p
}

// Activity is what the control plane knows of an actor's activity.
type Activity struct {
	// LastActive is the latest of the reported activity and, for a
	// RUNNING actor, the time it became RUNNING.
	LastActive time.Time
	// InFlight is the requests its reporters are serving, counting only
	// reports younger than activityStale.
	InFlight int
}

// busy reports whether the actor has a request in flight or was active
// after cutoff.
func (a Activity) busy(cutoff time.Time) bool { return a.InFlight > 0 || a.LastActive.After(cutoff) }

// ActivityOf returns the activity of actors by uid, read from the store
// (every replica's reports are there).
func (e *Engine) ActivityOf(ctx context.Context, actors []*torporv1.Actor) (map[string]Activity, error) {
	keys := make([]store.ActivityKey, len(actors))
	for i, a := range actors {
		keys[i] = store.ActivityKey{Space: a.GetMetadata().GetSpace(), Name: a.GetMetadata().GetName()}
	}
	reports, err := e.store.ActivityOf(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("read activity of %d actors: %w", len(actors), err)
	}
	byKey := map[store.ActivityKey]Activity{}
	now := e.now()
	for _, r := range reports {
		k := store.ActivityKey{Space: r.Space, Name: r.Name}
		act := byKey[k]
		if r.LastActive.After(act.LastActive) {
			act.LastActive = r.LastActive
		}
		if now.Sub(r.ReportTime) < activityStale {
			act.InFlight += r.InFlight
		}
		byKey[k] = act
	}
	out := make(map[string]Activity, len(actors))
	for i, a := range actors {
		act := byKey[keys[i]]
		st := a.GetStatus()
		if st.GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING && st.GetStateTime().AsTime().After(act.LastActive) {
			act.LastActive = st.GetStateTime().AsTime()
		}
		out[a.GetMetadata().GetUid()] = act
	}
	return out, nil
}

// touch records an API operation on an actor as its activity. Failing
// to record it costs the actor at most an early idle action, not the
// operation: it is logged, not returned.
func (e *Engine) touch(ctx context.Context, a *torporv1.Actor) {
	err := e.store.RecordActivity(ctx, []store.Activity{{Space: a.GetMetadata().GetSpace(), Name: a.GetMetadata().GetName(), Reporter: APIReporter, LastActive: e.now()}})
	if err != nil {
		e.logger(a).Warn("record activity", "err", err)
	}
}

// idleSweepers bounds the idle actions one sweep runs at once: each is a
// checkpoint on a node.
const idleSweepers = 4

// SweepIdle applies the idle policy to every RUNNING actor but E2B
// sandboxes (leases.go): one idle for its policy's time, with nothing in
// flight, is paused or suspended; then it relieves nodes short of memory
// (relieveMemory), keeps the pools' headroom (keepHeadroom) and the
// templates' warm workers (keepWarm).
// Every replica may sweep: the step's compare-and-set lets one act, and a
// request reported after the claim cancels it (stopIdle).
func (e *Engine) SweepIdle(ctx context.Context) error {
	err := e.stopIdleActors(ctx)
	// Headroom comes after the idle stops, which may have freed enough;
	// warmth after both, which free workers to warm.
	return errors.Join(err, e.relieveMemory(ctx), e.keepHeadroom(ctx), e.keepWarm(ctx))
}

// stopIdleActors pauses or suspends the RUNNING actors idle for their
// policy's time.
func (e *Engine) stopIdleActors(ctx context.Context) error {
	running, err := store.ListAll(ctx, e.store.Actors(), store.ListOptions{Filter: store.Filter{"state": torporv1.ActorState_ACTOR_STATE_RUNNING.String()}})
	if err != nil || len(running) == 0 {
		return err
	}
	acts, err := e.ActivityOf(ctx, running)
	if err != nil {
		return err
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, idleSweepers)
	)
	now := e.now()
	for _, a := range running {
		p := policyOf(a.GetStatus().GetCurrentTemplateSpec())
		act := acts[a.GetMetadata().GetUid()]
		// A sandbox's lease, not its idleness, decides when it stops
		// (EnforceLeases).
		if isSandbox(a) || p.idle == 0 || act.busy(now.Add(-p.idle)) {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			idleFor := now.Sub(act.LastActive).Round(time.Second)
			_, err := e.stopIdle(ctx, a, p.kind, stopCause{
				reason: fmt.Sprintf("idle for %s (idle policy: %s after %s)", idleFor, enum.Name(p.kind.done), p.idle),
				metric: "idle",
				cutoff: now.Add(-p.idle),
			})
			if err != nil && !errors.Is(err, errStopCancelled) && !errors.Is(err, errRetry) {
				mu.Lock()
				errs = append(errs, fmt.Errorf("idle %s of actor %s: %w", p.kind.metric(), actorKey(a), err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// stopCause is why stopIdle pauses or suspends an actor.
type stopCause struct {
	// reason goes in the actor's history.
	reason string
	// metric is the reason label of the idle/eviction metrics.
	metric string
	// cutoff: activity after it (or a request in flight) cancels the stop.
	cutoff time.Time
	// evictedFor, when set, is the actor the freed worker is reserved for.
	evictedFor *torporv1.Actor
}

// errStopCancelled: the actor turned out busy once the stop was claimed.
var errStopCancelled = errors.New("the actor became active; its idle stop is cancelled")

// stopIdle pauses or suspends a, which was idle since c.cutoff when last
// read. The claim (RUNNING → SUSPENDING or PAUSING, compare-and-set on
// the version read) comes first; the activity is read again once the
// claim is committed, and any activity after the cutoff cancels the stop
// before the node is called. A router reports a request for an actor it
// has not reported active lately before it asks whether the actor is
// RUNNING (router/activity.go), so such a request that found the actor
// RUNNING was reported before the claim and is seen by this second read;
// one for an actor reported active lately rides a batch that reaches the
// store well within the eviction minimum. No actor is stopped under a
// request.
func (e *Engine) stopIdle(ctx context.Context, a *torporv1.Actor, kind checkpointKind, c stopCause) (*torporv1.Actor, error) {
	claimed, err := e.claimCheckpoint(ctx, a, kind, c.reason, c.evictedFor)
	if err != nil {
		return nil, err
	}
	if h := e.hooks.AfterIdleClaim; h != nil {
		h(claimed)
	}
	acts, err := e.ActivityOf(ctx, []*torporv1.Actor{claimed})
	if err != nil || acts[claimed.GetMetadata().GetUid()].busy(c.cutoff) {
		why := "a request arrived"
		if err != nil {
			why = "its activity could not be read: " + err.Error()
		}
		return nil, e.cancelStop(ctx, claimed, why)
	}
	template := claimed.GetSpec().GetTemplate()
	out, err := e.drive(ctx, claimed, func(ctx context.Context) (*torporv1.Actor, error) { return e.driveCheckpoint(ctx, claimed) })
	if err == nil {
		e.metrics.stops.WithLabelValues(c.metric, kind.metric(), template).Inc()
		e.logger(claimed).Info("idle actor stopped", "reason", c.reason, "state", enum.Name(kind.done))
	}
	return out, err
}

// cancelStop returns a claimed, not yet started, idle stop to RUNNING:
// the node was not called, so nothing but the intent is undone.
func (e *Engine) cancelStop(ctx context.Context, claimed *torporv1.Actor, why string) error {
	op := claimed.GetStatus().GetOperation()
	err := e.endStep(ctx, e.logger(claimed), func() error {
		return e.store.InTx(ctx, func(tx store.Tx) error {
			end, err := endClaimedStep(ctx, tx, claimed, func(cur *torporv1.Actor) (struct{}, error) {
				cur.Status.Operation = nil
				return struct{}{}, e.setState(cur, torporv1.ActorState_ACTOR_STATE_RUNNING)
			}, func(*torporv1.Actor) bool { return false })
			if err != nil || end.written == nil {
				return err
			}
			return e.record(ctx, tx, claimed.GetMetadata().GetUid(), transition{
				from: claimed.GetStatus().GetState(), to: torporv1.ActorState_ACTOR_STATE_RUNNING, op: op,
				worker: claimed.GetStatus().GetWorker(), reason: "cancelled: " + why,
			})
		})
	})
	if err != nil {
		return fmt.Errorf("cancel the idle stop of actor %s: %w", actorKey(claimed), err)
	}
	e.metrics.stopsCancelled.Inc()
	return errStopCancelled
}

// PruneActivity forgets activity reported more than a day ago: an actor
// idle that long is idle since it became RUNNING as far as any policy is
// concerned, unless it has run for more than a day with no traffic in
// the last one.
func (e *Engine) PruneActivity(ctx context.Context) error {
	n, err := e.store.PruneActivity(ctx, e.now().Add(-24*time.Hour))
	if n > 0 {
		e.log.Info("pruned activity records", "count", n)
	}
	return err
}

// noEvictable is the ResourceExhausted answer of a resume that found no
// free worker and no actor to evict.
func noEvictable(a *torporv1.Actor, cause error, why string) error {
	return errdefs.Errorf(errdefs.ErrResourceExhausted, "actor %s: %v, and no running actor can be evicted (%s)", actorKey(a), cause, why)
}
