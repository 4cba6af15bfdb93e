package workflow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// An E2B sandbox (an actor with spec.sandbox) lives by its lease, not by
// its template's idle policy: while the lease runs the sandbox is neither
// idle-stopped nor evicted, and when it ends EnforceLeases kills it, or
// suspends it when it asked for auto_pause. A sandbox suspended at the end
// of its lease stays so until connect or traffic (auto_resume) resumes it;
// a resume renews a lease that is over (renewLeaseOnResume).

// Reasons in a sandbox's history when its lease ends.
const (
	leaseKilledReason = "lease ended: killed (no auto_pause): the workload is stopped without a snapshot"
	leasePausedReason = "lease ended: paused (auto_pause): suspended to snapshot storage, resumable on any node"
)

// leaseEnders bounds the lease ends one pass runs at once: each is a
// checkpoint or a terminate on a node.
const leaseEnders = 4

// leaseEndStates are the states in which the end of a lease acts.
var leaseEndStates = []torporv1.ActorState{
	torporv1.ActorState_ACTOR_STATE_RUNNING,
	torporv1.ActorState_ACTOR_STATE_RESUMING,
	torporv1.ActorState_ACTOR_STATE_CRASHED,
}

// isSandbox: a is an E2B sandbox, which its lease governs.
func isSandbox(a *torporv1.Actor) bool { return a.GetSpec().GetSandbox() != nil }

// leaseOver: a is an E2B sandbox whose lease ended at or before now.
func leaseOver(a *torporv1.Actor, now time.Time) bool {
	return isSandbox(a) && !a.GetSpec().GetSandbox().GetEndTime().AsTime().After(now)
}

// renewLeaseOnResume stamps the resume of a sandbox into a (a resume's
// claim, written with it): start_time is now, and a lease that is over
// (a sandbox paused at its end, resumed by traffic with auto_resume) runs
// again for the sandbox's timeout, so the lease's end does not stop it
// again at once. A lease still running (connect moved it first) is kept.
func renewLeaseOnResume(a *torporv1.Actor, now time.Time) {
	if !isSandbox(a) {
		return
	}
	sb := proto.CloneOf(a.GetSpec().GetSandbox())
	sb.StartTime = timestamppb.New(now)
	if !sb.GetEndTime().AsTime().After(now) {
		sb.EndTime = timestamppb.New(now.Add(time.Duration(sb.GetTimeoutSeconds()) * time.Second))
	}
	a.Spec.Sandbox = sb
}

// LeaseUpdate moves the end of a sandbox's lease.
type LeaseUpdate struct {
	// Timeout from now is the new end; 0 with ExtendOnly is the
	// sandbox's own timeout (spec.sandbox.timeout_seconds).
	Timeout time.Duration
	// ExtendOnly keeps an end later than now + Timeout (E2B's connect
	// only ever extends; its setTimeout may shorten).
	ExtendOnly bool
}

// UpdateLease moves the lease end of sandbox space/name, in a versioned
// update of the actor (a lease end racing it acts on the version it read,
// or not at all), and returns the actor. NotFound when the actor is no
// sandbox or is being deleted (a killed sandbox is gone for E2B).
func (e *Engine) UpdateLease(ctx context.Context, space, name string, u LeaseUpdate) (*torporv1.Actor, error) {
	if u.Timeout < 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "sandbox %s/%s: a lease of %s is negative", space, name, u.Timeout)
	}
	for range maxAttempts {
		a, err := e.store.Actors().Get(ctx, space, name)
		if err != nil {
			return nil, err
		}
		if !isSandbox(a) {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s/%s: the actor is no E2B sandbox", space, name)
		}
		if a.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_DELETING {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "sandbox %s/%s is being killed", space, name)
		}
		sb := a.GetSpec().GetSandbox()
		timeout := u.Timeout
		if timeout == 0 && u.ExtendOnly {
			timeout = time.Duration(sb.GetTimeoutSeconds()) * time.Second
		}
		end := e.now().Add(timeout)
		if u.ExtendOnly && !end.After(sb.GetEndTime().AsTime()) {
			return a, nil
		}
		sb = proto.CloneOf(sb)
		sb.EndTime = timestamppb.New(end)
		a.Spec.Sandbox = sb
		updated, err := e.store.Actors().Update(ctx, a)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("sandbox %s/%s: move the lease end: %w", space, name, err)
		}
		return updated, nil
	}
	return nil, errdefs.Errorf(errdefs.ErrAborted, "sandbox %s/%s: too many concurrent changes, retry", space, name)
}

// EnforceLeases ends the leases that are over: each sandbox RUNNING (or
// RESUMING) past its lease end is killed, forcibly deleted without a
// snapshot, or suspended when it asked for auto_pause. A CRASHED one is
// killed too (its workload is gone, so a kill leaves nothing either); with
// auto_pause it stays, paused as E2B sees it, until connect resumes it
// from its latest snapshot. Every replica may
// run it: each end acts on the actor as read again just before, by a
// compare-and-set on its version, so one replica acts and a connect that
// moved the lease first wins.
func (e *Engine) EnforceLeases(ctx context.Context) error {
	var due []*torporv1.Actor
	now := e.now()
	for _, state := range leaseEndStates {
		actors, err := store.ListAll(ctx, e.store.Actors(), store.ListOptions{Filter: store.Filter{"state": state.String()}})
		if err != nil {
			return fmt.Errorf("find sandboxes whose lease ended: %w", err)
		}
		for _, a := range actors {
			if leaseOver(a, now) {
				due = append(due, a)
			}
		}
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, leaseEnders)
	)
	for _, a := range due {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := e.endLease(ctx, a); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("end the lease of sandbox %s: %w", actorKey(a), err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// endLease kills or suspends listed, a sandbox found past its lease end,
// once read again: a connect may have moved the lease since the list. A
// change after this read makes the claim fail and leaves the sandbox to
// the next pass, which reads it anew.
func (e *Engine) endLease(ctx context.Context, listed *torporv1.Actor) error {
	m := listed.GetMetadata()
	a, err := e.store.Actors().Get(ctx, m.GetSpace(), m.GetName())
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	state := a.GetStatus().GetState()
	if a.GetMetadata().GetUid() != m.GetUid() || !leaseOver(a, e.now()) || !slices.Contains(leaseEndStates, state) {
		return nil
	}
	if h := e.hooks.BeforeLeaseEnd; h != nil {
		h(a)
	}
	if !a.GetSpec().GetSandbox().GetAutoPause() {
		start := e.now()
		err := e.deleteActor(ctx, a, DeleteOptions{Force: true}, leaseKilledReason)
		e.metrics.observe("delete", start, err)
		switch {
		case errors.Is(err, errdefs.ErrAborted) || errors.Is(err, store.ErrNotFound):
			return nil // changed since the read: the next pass decides
		case err != nil:
			return err
		}
		e.metrics.leaseEnds.WithLabelValues("kill").Inc()
		e.logger(a).Info("sandbox lease ended: killed")
		return nil
	}
	if state != torporv1.ActorState_ACTOR_STATE_RUNNING {
		return nil // RESUMING: suspended once running, by the next pass; CRASHED: stays paused
	}
	start := e.now()
	claimed, err := e.claimCheckpoint(ctx, a, suspendKind, leasePausedReason, nil)
	if errors.Is(err, errRetry) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = e.drive(ctx, claimed, func(ctx context.Context) (*torporv1.Actor, error) { return e.driveCheckpoint(ctx, claimed) })
	e.metrics.observe(suspendKind.metric(), start, err)
	if err != nil {
		return err
	}
	e.metrics.leaseEnds.WithLabelValues("pause").Inc()
	e.logger(a).Info("sandbox lease ended: paused")
	return nil
}
