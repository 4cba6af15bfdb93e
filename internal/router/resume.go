package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/exits"
	"github.com/torpor-dev/torpor/internal/retry"
	"github.com/torpor-dev/torpor/internal/tracing"
)

// parkBackoff is how the router asks the control plane again while it has
// no free worker or cannot answer (restarting, its database restarting):
// short waits at first (a worker is often freed within milliseconds by a
// suspend in flight), capped so a long wait does not hammer the control
// plane. ParkTimeout bounds the waits as a deadline (parked), not as a
// Budget, which would give up as soon as the next wait overran it: the
// requests get the whole park bound they were promised.
var parkBackoff = retry.Policy{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond}

// parked bounds waits for the control plane by ParkTimeout.
func (r *Router) parked(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.ParkTimeout)
}

// unavailable tells a control plane that cannot answer now, including one
// out of reach (connect reports most transport failures as Unavailable),
// from one that answered.
func unavailable(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable:
		return true
	case connect.CodeCanceled, connect.CodeUnknown:
		// A control plane killed mid-call resets the connection (or breaks
		// the pipe the request is being written to), which the client
		// reports as canceled; a request whose own client left is canceled
		// by its context instead, and is not asked again.
		return !errors.Is(err, context.Canceled) && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
			errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed))
	}
	return false
}

// askParked calls fn, a read of the control plane, again while the
// control plane cannot answer, until ParkTimeout: then the error is
// errControlPlaneDown, about what.
func (r *Router) askParked(ctx context.Context, what string, fn func(context.Context) error) error {
	parked, cancel := r.parked(ctx)
	defer cancel()
	b := parkBackoff.Start()
	for {
		err := fn(parked)
		if !unavailable(err) {
			return err
		}
		if !b.Wait(parked) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%s: %w for %s: %w", what, errControlPlaneDown, r.cfg.ParkTimeout, err)
		}
	}
}

// abandonResumeAfter bounds a resume call nobody waits for any more. The
// call is not cancelled when its requests give up at ResumeTimeout:
// cancelling a resume half way would leave the actor RESUMING until the
// control plane's recovery sweep, while letting it finish leaves the actor
// RUNNING for the client's retry.
const abandonResumeAfter = 10 * time.Minute

var (
	errNoWorker      = errors.New("no worker is free")
	errResumeTimeout = errors.New("resume timed out")
	// errResumeFailed: the control plane answered the resume with an
	// error, which keeps its code.
	errResumeFailed = errors.New("resume failed")
	// errControlPlaneDown: the control plane answered Unavailable, or was
	// out of reach, for the whole park bound.
	errControlPlaneDown = errors.New("the control plane is unavailable")
)

// resumeFlight is one resume of one actor that any number of requests wait
// for.
type resumeFlight struct {
	done  chan struct{}
	actor *torporv1.Actor
	err   error
}

type flights struct {
	mu sync.Mutex
	m  map[ActorKey]*resumeFlight
}

// awaitResume waits for the actor to be RUNNING, joining the resume in
// flight for it or starting one. ctx only bounds this caller's wait: the
// resume goes on for the others.
func (r *Router) awaitResume(ctx context.Context, key ActorKey) (*torporv1.Actor, error) {
	r.flights.mu.Lock()
	f := r.flights.m[key]
	if f == nil {
		f = &resumeFlight{done: make(chan struct{})}
		r.flights.m[key] = f
		// The flight outlives the request that started it, and is part
		// of its trace.
		go r.fly(tracing.Detach(ctx), key, f)
	}
	r.flights.mu.Unlock()

	r.metrics.parked.Inc()
	defer r.metrics.parked.Dec()
	select {
	case <-f.done:
		return f.actor, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (r *Router) fly(ctx context.Context, key ActorKey, f *resumeFlight) {
	ctx, span := tracing.Start(ctx, "router.resume", attribute.String("actor", key.String()))
	defer span.End()
	f.actor, f.err = r.resumeParked(ctx, key)
	r.metrics.resumes.WithLabelValues(resumeResult(f.err)).Inc()
	if f.err != nil {
		r.log.Warn("resume failed", "actor", key.String(), "err", f.err)
	}
	r.flights.mu.Lock()
	delete(r.flights.m, key)
	r.flights.mu.Unlock()
	close(f.done)
}

// resumeParked resumes the actor, asking again while the control plane
// has no free worker or cannot answer, until ParkTimeout.
func (r *Router) resumeParked(ctx context.Context, key ActorKey) (*torporv1.Actor, error) {
	// The flight outlives the requests that wait for it (ctx is not
	// theirs), so only the park bound ends it.
	ctx, cancel := r.parked(ctx)
	defer cancel()
	b := parkBackoff.Start()
	repeat := false
	for {
		a, err := r.resumeOnce(ctx, key, repeat)
		noWorker := connect.CodeOf(err) == connect.CodeResourceExhausted
		repeat = repeat || noWorker
		// An actor whose workload exited is not waited for: its restart
		// policy decides, and the client hears of the exit at once.
		if err == nil || exits.Of(err) != nil || !noWorker && !unavailable(err) {
			return a, err
		}
		if !b.Wait(ctx) {
			if noWorker {
				return nil, fmt.Errorf("actor %s: %w for %s: %w", key, errNoWorker, r.cfg.ParkTimeout, err)
			}
			return nil, fmt.Errorf("actor %s: %w for %s: %w", key, errControlPlaneDown, r.cfg.ParkTimeout, err)
		}
	}
}

// resumeOnce makes one ResumeActor call, waiting at most ResumeTimeout for
// it; repeat says it asks again for the same parked requests (the control
// plane counts their refusal once). A call that outlives the wait still
// finishes, and what it learns is kept.
func (r *Router) resumeOnce(ctx context.Context, key ActorKey, repeat bool) (*torporv1.Actor, error) {
	type result struct {
		actor *torporv1.Actor
		err   error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonResumeAfter)
		defer cancel()
		r.metrics.requestCalls.WithLabelValues(callResume).Inc()
		resp, err := r.api.ResumeActor(ctx, connect.NewRequest(&torporv1.ResumeActorRequest{Space: key.Space, Name: key.Name, Repeat: repeat, OnDemand: true}))
		if err != nil {
			done <- result{err: fmt.Errorf("actor %s: %w: %w", key, errResumeFailed, err)}
			return
		}
		a := resp.Msg
		if _, err := r.learn(key, a); err != nil {
			done <- result{err: err}
			return
		}
		done <- result{actor: a}
	}()
	timer := time.NewTimer(r.cfg.ResumeTimeout)
	defer timer.Stop()
	select {
	case res := <-done:
		return res.actor, res.err
	case <-timer.C:
		return nil, fmt.Errorf("actor %s: %w after %s", key, errResumeTimeout, r.cfg.ResumeTimeout)
	}
}

func resumeResult(err error) string {
	switch {
	case err == nil:
		return resumeRunning
	case errors.Is(err, errNoWorker):
		return resumeNoWorker
	case errors.Is(err, errResumeTimeout):
		return resumeTimeout
	case errors.Is(err, errControlPlaneDown):
		return resumeUnavailable
	case connect.CodeOf(err) == connect.CodeNotFound:
		return resumeNotFound
	}
	return resumeFailed
}
