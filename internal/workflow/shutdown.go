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
