package node

import (
	"context"
	"errors"
)

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
