package workflow

import (
	"fmt"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// StopResuming makes every later Resume (and so every exec, copy, fork or
// tunnel that would resume) fail as unavailable, saying why. A control
// plane that suspends the actors of a machine it is about to stop (torpor
// up) calls it first, so no sandbox starts after the suspends: a caller
// retrying an exec cut by the stop would otherwise resume its actor
// behind them.
func (e *Engine) StopResuming() { e.stopping.Store(true) }

// refuseWhileStopping is Resume's answer after StopResuming.
func (e *Engine) refuseWhileStopping(space, name string) error {
	if !e.stopping.Load() {
		return nil
	}
	return fmt.Errorf("resume actor %s/%s: %w: the control plane is shutting down; resume it once it is back", space, name, errdefs.ErrUnavailable)
}

// Close cancels the steps this engine drives apart from their callers and
// waits for their drivers to return; no step is driven after it. A step cut
// short is left in flight, not half applied: its node call was not
// answered, or its end not written, and Recover (this control plane's next
// start, or another replica's sweep) finishes it with the same operation
// id (DESIGN invariant 3). The caller closes the store only after Close
// returns.
func (e *Engine) Close() { e.driving.close() }
