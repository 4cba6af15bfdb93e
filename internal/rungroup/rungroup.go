// Package rungroup runs the parts of a process together: each part is
// started once the ones before it are ready, the first part to end on its
// own stops the rest, and stopping goes in the reverse order of starting,
// each part ended before the one started before it is told to stop (the
// router before the node agent it sends requests to, the node agent before
// the API it reports to).
package rungroup

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Group is a set of running parts. The zero value is not usable: see New.
type Group struct {
	base context.Context

	mu      sync.Mutex
	parts   []*part
	stopped bool

	stopOnce sync.Once
	stopErr  error

	failOnce sync.Once
	failed   chan struct{}
	failure  error
}

type part struct {
	name string
	stop context.CancelFunc
	done chan struct{}
	err  error
}

// New returns an empty group. The parts' contexts carry ctx's values but
// not its cancellation: only Stop (or Run, when its context ends) stops
// them, in order.
func New(ctx context.Context) *Group {
	return &Group{base: context.WithoutCancel(ctx), failed: make(chan struct{})}
}

// Go runs fn as part name until Stop cancels its context. A part that
// returns before that fails the group (see Failed) with its error, or
// with one saying it ended when it returned none. A part should start
// only once the parts it needs are ready: start them first, and wait for
// what says they are (a listener bound, a node registered) before calling
// Go for the next.
func (g *Group) Go(name string, fn func(ctx context.Context) error) {
	ctx, stop := context.WithCancel(g.base)
	p := &part{name: name, stop: stop, done: make(chan struct{})}
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		stop()
		return
	}
	g.parts = append(g.parts, p)
	g.mu.Unlock()
	go func() {
		defer close(p.done)
		err := fn(ctx)
		stopped := ctx.Err() != nil
		switch {
		case stopped && errors.Is(err, context.Canceled):
			err = nil // stopped, as asked
		case !stopped && err == nil:
			err = errors.New("ended")
		}
		if err != nil {
			p.err = fmt.Errorf("%s: %w", name, err)
		}
		if !stopped {
			g.fail(p.err)
		}
	}()
}

func (g *Group) fail(err error) {
	g.failOnce.Do(func() {
		g.failure = err
		close(g.failed)
	})
}

// Failed is closed when a part ended on its own; Err then says which and
// why.
func (g *Group) Failed() <-chan struct{} { return g.failed }

// Err is the first part's failure, nil while none failed.
func (g *Group) Err() error {
	select {
	case <-g.failed:
		return g.failure
	default:
		return nil
	}
}

// Run waits until ctx is done or a part fails, then stops the group and
// returns what Stop does.
func (g *Group) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case <-g.failed:
	}
	return g.Stop()
}

// Stop stops the parts, the last started first, each ended before the
// one before it is stopped; parts added later are not run. It returns the
// errors of the parts (a failure, and what they returned when stopped),
// the same to every call.
func (g *Group) Stop() error {
	g.stopOnce.Do(func() {
		g.mu.Lock()
		g.stopped = true
		parts := g.parts
		g.mu.Unlock()
		for i := len(parts) - 1; i >= 0; i-- {
			parts[i].stop()
			<-parts[i].done
		}
		errs := make([]error, 0, len(parts))
		for _, p := range parts {
			errs = append(errs, p.err)
		}
		g.stopErr = errors.Join(errs...)
	})
	return g.stopErr
}
