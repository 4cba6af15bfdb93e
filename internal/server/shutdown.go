package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/store"
)

// settlePoll is how often SuspendAll looks again at steps under way.
const settlePoll = 100 * time.Millisecond

// SuspendAll suspends every RUNNING actor, so a single-machine shutdown
// leaves nothing running that would need its node to come back. No resume
// starts after it is called (Engine.StopResuming); one under way, as a
// suspend or pause is, is waited for first: a resume that lands after the
// actors were listed would leave its sandbox running. It returns
// the actors suspended and the errors of those that could not be, each
// tried once; steps still under way when ctx ends are an error naming
// them.
func (s *Server) SuspendAll(ctx context.Context) (int, error) {
	s.engine.StopResuming()
	var errs []error
	n := 0
	tried := map[string]bool{}
	for {
		actors, err := store.ListAll(ctx, s.store.Actors(), store.ListOptions{})
		if err != nil {
			return n, errors.Join(append(errs, err)...)
		}
		var underWay []string
		suspended := false
		for _, a := range actors {
			m := a.GetMetadata()
			switch a.GetStatus().GetState() {
			case torporv1.ActorState_ACTOR_STATE_RUNNING:
				if tried[m.GetUid()] {
					continue
				}
				tried[m.GetUid()] = true
				suspended = true
				if _, err := s.engine.Suspend(ctx, m.GetSpace(), m.GetName()); err != nil {
					errs = append(errs, err)
					continue
				}
				n++
			case torporv1.ActorState_ACTOR_STATE_RESUMING, torporv1.ActorState_ACTOR_STATE_SUSPENDING, torporv1.ActorState_ACTOR_STATE_PAUSING:
				underWay = append(underWay, fmt.Sprintf("%s/%s (%s)", m.GetSpace(), m.GetName(), enum.Name(a.GetStatus().GetState())))
			}
		}
		if len(underWay) == 0 && !suspended {
			return n, errors.Join(errs...)
		}
		if suspended {
			continue // a suspend took time: look again at once
		}
		select {
		case <-ctx.Done():
			return n, errors.Join(append(errs, fmt.Errorf("steps still under way: %s: %w", strings.Join(underWay, ", "), ctx.Err()))...)
		case <-time.After(settlePoll):
		}
	}
}

// Close ends what the server still runs once its API no longer serves:
// the engine's step drivers (their steps left in flight for the next
// Recover, see workflow.Engine.Close), the input relays of exec calls and
// the connections to node agents. Its owner closes the store after it.
func (s *Server) Close() {
	s.engine.Close()
	s.relays.Wait()
	s.agents.close()
}
