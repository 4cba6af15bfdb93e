package node

import (
	"context"
	"errors"
	"sync"

	"github.com/torpor-dev/torpor/internal/httpserve"
)

// errAgentStopping ends the calls that last as long as their caller wants
// (an exec) when the agent stops: its stop would otherwise wait for them,
// give up, and leave their runsc processes behind.
var errAgentStopping = errors.New("the node agent is stopping; run it again once the agent is back")

// untilDraining is ctx, cancelled with errAgentStopping once the agent's
// server begins to stop.
func untilDraining(ctx context.Context) (context.Context, context.CancelFunc) {
	return cancelWhenClosed(ctx, httpserve.Draining(ctx), errAgentStopping)
}

// cancelWhenClosed is ctx, cancelled with cause once closed is closed.
// Its cancel func ends the watch on closed and waits for it, so no
// goroutine outlives the call that made it.
func cancelWhenClosed(ctx context.Context, closed <-chan struct{}, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	var watch sync.WaitGroup
	watch.Go(func() {
		select {
		case <-closed:
			cancel(cause)
		case <-ctx.Done():
		}
	})
	return ctx, func() {
		cancel(nil)
		watch.Wait()
	}
}

// endGoldenBuilds stops, at the agent's stop, the golden builds still on
// its workers. A build is no actor's workload to keep for the next start
// (the control plane builds its template again), so leaving it would
// leave its sandbox, its mounts and, holding them, the workers' network.
// The operations have ended: no build goes on meanwhile.
func (m *slotMachine) endGoldenBuilds(ctx context.Context) error {
	var errs []error
	for _, s := range m.slots {
		s.lock()
		cur := s.current()
		if w, err := cur.workload(); err == nil && cur.ActorUID != "" && isGolden(w) {
			err := m.vacate(ctx, s, cur)
			if commitErr := s.commit(nil); err == nil {
				err = commitErr
			}
			if err != nil {
				errs = append(errs, err)
			} else {
				m.log.Info("golden build ended by the stop; the control plane builds it again", "worker", s.name(), "template", w.GetTemplateName())
			}
		}
		s.unlock()
	}
	return errors.Join(errs...)
}
