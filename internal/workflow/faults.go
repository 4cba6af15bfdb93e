package workflow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/retry"
	"github.com/torpor-dev/torpor/internal/store"
)

// Transient faults are absorbed (DESIGN invariant 9): a node that does not
// answer leaves its step in flight and the node call is repeated, with the
// same operation id, until the node answers or its heartbeat timeout
// declares it lost; a finalize the store refused for a while is written
// again. Only a lost node or a definite failure of the workload crashes
// an actor.

// nodeRetry paces the repeats of a node call while its node is
// unreachable: short at first (an agent restart takes about a second),
// never longer than a second, so a step goes on soon after the node is
// back.
var nodeRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: time.Second}

// finalizeRetry paces the re-writes of a step's end while the store does
// not take it. Past its budget the step is left to Recover.
var finalizeRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Budget: 2 * time.Minute}

// unreachable reports whether err says a node call did not get an answer
// from the node (refused, reset, cut short, the agent restarting), as
// opposed to the node reporting the operation's outcome.
func unreachable(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	switch {
	case errdefs.Answered(err):
		// The node's own outcome, whatever its kind (a readiness probe's
		// deadline is a context.DeadlineExceeded, which is a net.Error
		// too): unreachable only when the node says it cannot take the
		// call now, or that it stopped mid-operation (below).
		return errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, context.Canceled)
	case errors.Is(err, store.ErrUnavailable):
		// The node's address could not be read.
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.As(err, &ne):
		return true
	}
	// Canceled: the agent stopped mid-operation (it does not record such
	// an outcome, so the repeat runs the operation again); a caller that
	// gave up is told apart by its own context.
	return errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, context.Canceled)
}

// errNodeLost ends the repeats of a node call: the node's heartbeat
// timeout declared it lost.
var errNodeLost = errors.New("node lost")

// untilNodeAnswers calls fn, the node call of a's step, until the node
// answers. While the node is unreachable the step stays in flight and the
// call is repeated. The node being declared lost ends it, even during a
// call that hangs (a frozen node): the error then wraps errNodeLost. So
// does a's step ending elsewhere (another driver, a crash): cur is then
// the actor as it is now, and fn's last error is returned.
func (e *Engine) untilNodeAnswers(ctx context.Context, a *torporv1.Actor, fn func(context.Context) error) (cur *torporv1.Actor, err error) {
	node := a.GetStatus().GetWorker().GetNode()
	b := nodeRetry.Start()
	for attempt := 1; ; attempt++ {
		err = e.whileNodeLives(ctx, node, fn)
		if err == nil || errors.Is(err, errNodeLost) || ctx.Err() != nil || !unreachable(err) {
			return nil, err
		}
		if attempt == 1 {
			e.logger(a).Warn("node unreachable; the step stays in flight and its node call is repeated", "err", err)
		}
		if !b.Wait(ctx) {
			return nil, err
		}
		if lost, why := e.nodeLost(ctx, node); lost {
			return nil, fmt.Errorf("%w: %s; last error: %w", errNodeLost, why, err)
		}
		now, rerr := e.store.Actors().Get(ctx, a.GetMetadata().GetSpace(), a.GetMetadata().GetName())
		if rerr == nil && !sameStep(now, a) {
			return now, err
		}
	}
}

// whileNodeLives runs fn with a context that ends, with errNodeLost as its
// cause, when the node's heartbeat timeout declares it lost.
func (e *Engine) whileNodeLives(ctx context.Context, node string, fn func(context.Context) error) error {
	callCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var watch sync.WaitGroup
	watch.Go(func() {
		t := time.NewTicker(max(e.opts.HeartbeatTimeout/3, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-callCtx.Done():
				return
			case <-t.C:
			}
			if lost, why := e.nodeLost(callCtx, node); lost {
				cancel(fmt.Errorf("%w: %s", errNodeLost, why))
				return
			}
		}
	})
	err := fn(callCtx)
	cancel(nil)
	watch.Wait()
	if cause := context.Cause(callCtx); errors.Is(cause, errNodeLost) && ctx.Err() == nil {
		return fmt.Errorf("%w (the node call was cut short: %w)", cause, err)
	}
	return err
}

// stillInFlight reports whether a failed node call leaves its step in
// flight rather than failed: the driver itself was stopped (server
// shutting down) or the node did not answer.
func stillInFlight(ctx context.Context, err error) bool {
	if errors.Is(err, errNodeLost) {
		return false
	}
	return ctx.Err() != nil || unreachable(err)
}

// sameStep reports whether cur is still in the step a was claimed for.
func sameStep(cur, a *torporv1.Actor) bool {
	return cur.GetMetadata().GetUid() == a.GetMetadata().GetUid() &&
		cur.GetStatus().GetState() == a.GetStatus().GetState() &&
		cur.GetStatus().GetOperation().GetId() == a.GetStatus().GetOperation().GetId()
}

// inSameStep runs write in a transaction, written again while the store
// restarts (endStep), with the actor as stored, if it is still in the step
// a was claimed for; else nothing is written over whoever moved it on.
func (e *Engine) inSameStep(ctx context.Context, a *torporv1.Actor, write func(tx store.Tx, cur *torporv1.Actor) error) error {
	return e.endStep(ctx, e.logger(a), func() error {
		return e.store.InTx(ctx, func(tx store.Tx) error {
			cur, err := tx.Actors().Get(ctx, a.GetMetadata().GetSpace(), a.GetMetadata().GetName())
			if err != nil {
				return err
			}
			if !sameStep(cur, a) {
				return nil
			}
			return write(tx, cur)
		})
	})
}

// nodeLost reads the node's record: lost when it is gone or its last
// heartbeat is older than the heartbeat timeout. A store that cannot say
// is not taken for a lost node.
func (e *Engine) nodeLost(ctx context.Context, node string) (bool, string) {
	n, err := e.store.Nodes().Get(ctx, "", node)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return true, fmt.Sprintf("node %s is not registered", node)
	case err != nil:
		return false, ""
	case !e.alive(n):
		return true, fmt.Sprintf("node %s stopped heartbeating (last %s)", node, n.GetHeartbeatTime().AsTime().Format("15:04:05.000"))
	}
	return false, ""
}

// endStep runs write, a step's finalizing transaction, until the store
// takes it: a store that is restarting costs the step time, not its
// outcome. write must be safe to repeat (endClaimedStep is: a repeat after
// a commit whose answer was lost finds the step finished).
func (e *Engine) endStep(ctx context.Context, log *slog.Logger, write func() error) error {
	logged := false
	return retry.Do(ctx, finalizeRetry, func(err error) bool {
		transient := errors.Is(err, store.ErrUnavailable)
		if transient && !logged {
			logged = true
			log.Warn("store unavailable; the step's end is written again", "err", err)
		}
		return transient
	}, func(context.Context) error { return write() })
}

// drivers are the steps this engine is driving, by operation id, so
// Recover does not start a second driver of the same step in this
// process; and the goroutines that drive them apart from their callers
// (drive), which Close cancels and waits for.
type drivers struct {
	mu sync.Mutex
	m  map[string]struct{}
	// closed: Close was called; no driver starts after it.
	closed  bool
	running sync.WaitGroup
	// life ends the detached drivers' contexts: Close cancels it.
	life context.Context
	end  context.CancelFunc
}

func newDrivers() *drivers {
	d := &drivers{}
	d.life, d.end = context.WithCancel(context.Background())
	return d
}

var (
	errDriving      = errors.New("being driven already")
	errEngineClosed = errors.New("the engine is closed")
)

// start registers the driving of op and reports false when this engine
// drives it already.
func (d *drivers) start(op string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.startLocked(op)
}

func (d *drivers) startLocked(op string) bool {
	if _, ok := d.m[op]; ok {
		return false
	}
	if d.m == nil {
		d.m = map[string]struct{}{}
	}
	d.m[op] = struct{}{}
	return true
}

func (d *drivers) done(op string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.m, op)
}

// detach runs fn, the driver of op, in a goroutine of its own whose
// context carries ctx's values but not its cancellation: Close cancels
// it, and waits for fn to return. It fails with errDriving when op is
// driven already, errEngineClosed after Close.
func (d *drivers) detach(ctx context.Context, op string, fn func(context.Context)) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errEngineClosed
	}
	if !d.startLocked(op) {
		return errDriving
	}
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	unlink := context.AfterFunc(d.life, cancel)
	d.running.Go(func() {
		defer d.done(op)
		defer unlink()
		defer cancel()
		fn(dctx)
	})
	return nil
}

// close cancels the detached drivers and waits for them to return.
func (d *drivers) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.end()
	d.running.Wait()
}

// drive runs a committed step's driver apart from its caller: a caller
// that gives up (a client's deadline, a router's timeout) does not leave
// the step half way, the driver finishes it. The caller gets the outcome,
// or, if it stops waiting first, an error saying the step goes on. A
// driver that Close cuts short leaves its step in flight, as a crashed
// control plane does, for Recover; after Close the step is not driven at
// all and waits for Recover the same way.
func (e *Engine) drive(ctx context.Context, a *torporv1.Actor, fn func(context.Context) (*torporv1.Actor, error)) (*torporv1.Actor, error) {
	op := a.GetStatus().GetOperation().GetId()
	type outcome struct {
		a   *torporv1.Actor
		err error
	}
	done := make(chan outcome, 1)
	err := e.driving.detach(ctx, op, func(ctx context.Context) {
		out, err := fn(ctx)
		done <- outcome{out, err}
	})
	switch {
	case errors.Is(err, errDriving):
		return nil, errdefs.Errorf(errdefs.ErrAborted, "actor %s: operation %s is being driven already", actorKey(a), op)
	case errors.Is(err, errEngineClosed):
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "actor %s: %s %s is left in flight for recovery: %w", actorKey(a), enum.Name(a.GetStatus().GetState()), op, err)
	}
	select {
	case o := <-done:
		return o.a, o.err
	case <-ctx.Done():
		return nil, fmt.Errorf("actor %s: stopped waiting for %s %s, which goes on: %w", actorKey(a), enum.Name(a.GetStatus().GetState()), op, ctx.Err())
	}
}
