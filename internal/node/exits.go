package node

// Exits (DESIGN invariant 11). Every workload a slot runs is watched
// (watch) from the moment the runtime started it: an exit while it
// starts fails the start with the exit (waitReady, as a probe that
// cannot pass), and an exit once it runs frees the slot at once and
// tells the control plane (exited, report), which crashes the actor and
// applies its restart policy. The slot record keeps the last exit
// (slotRecord.Exit) until the slot's next workload, so a checkpoint that
// comes too late names it, and a restarted agent reports it again.

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/actorlog"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/exits"
	"github.com/torpor-dev/torpor/internal/retry"
	"github.com/torpor-dev/torpor/internal/runtime"
)

const (
	// exitOutputLines and exitLineBytes bound the output an exit carries
	// (its event's reason, the errors naming it).
	exitOutputLines = 3
	exitLineBytes   = 256
	// exitSettle is how long a checkpoint that failed waits for the
	// watch to say whether the workload exited meanwhile.
	exitSettle = time.Second
)

// exitWaiter is a runtime that tells when a container of a slot's
// workload exits (gvisor.Runtime.WaitExit).
type exitWaiter interface {
	WaitExit(ctx context.Context, slot runtime.Slot) (runtime.Exit, error)
}

// exitReporter tells the control plane of an exit (NodeService).
type exitReporter interface {
	ReportExit(context.Context, *connect.Request[torporv1.ReportExitRequest]) (*connect.Response[torporv1.ReportExitResponse], error)
}

// exitRecord is, on a slot its workload's exit freed, what the control
// plane is told.
type exitRecord struct {
	ActorUID  string          `json:"actorUid"`
	Operation string          `json:"operation"`
	Exit      json.RawMessage `json:"exit"`
}

func (r *exitRecord) exit() *torporv1.ContainerExit {
	e := &torporv1.ContainerExit{}
	if r == nil || protojson.Unmarshal(r.Exit, e) != nil {
		return nil
	}
	return e
}

// exitWatch watches one workload of a slot: done is closed once it
// exited, with how in exit.
type exitWatch struct {
	done   chan struct{}
	exit   runtime.Exit
	cancel context.CancelFunc
}

// exitedWithin waits up to d for the watched workload's exit.
func (w *exitWatch) exitedWithin(d time.Duration) (runtime.Exit, bool) {
	if w == nil {
		return runtime.Exit{}, false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.done:
		return w.exit, true
	case <-t.C:
		return runtime.Exit{}, false
	}
}

// watch starts watching the workload the runtime runs in s now. A
// runtime that cannot tell exits gives a watch that never fires.
func (m *slotMachine) watch(s *slot) *exitWatch {
	ctx, cancel := context.WithCancel(m.watching)
	w := &exitWatch{done: make(chan struct{}), cancel: cancel}
	waiter, ok := m.base.(exitWaiter)
	if !ok {
		return w
	}
	m.watchers.Go(func() {
		backoff := retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}.Start()
		for {
			exit, err := waiter.WaitExit(ctx, s.rt)
			if err == nil {
				w.exit = exit
				close(w.done)
				return
			}
			if ctx.Err() != nil || errors.Is(err, runtime.ErrNotRunning) {
				return
			}
			m.log.Warn("watching a workload for its exit failed; watching again", "worker", s.name(), "err", err)
			if !backoff.Wait(ctx) {
				return
			}
		}
	})
	return w
}

// follow hands the exit of the workload rec records running in s, when
// it comes, to exited; the workload's start is on record by then (the
// slot's lock waits for it).
func (m *slotMachine) follow(s *slot, rec slotRecord, w *exitWatch) {
	s.mu.Lock()
	if s.watch != nil {
		s.watch.cancel()
	}
	s.watch = w
	s.mu.Unlock()
	m.watchers.Go(func() {
		select {
		case <-w.done:
			m.exited(s, rec, w.exit)
		case <-m.watching.Done():
		}
	})
}

// stopWatching ends every watch, for the agent's stop: workloads outlive
// it, and the next agent watches them again.
func (m *slotMachine) stopWatching() {
	m.stopWatches()
	m.watchers.Wait()
}

// exited frees s of the workload rec recorded, which exited, and tells
// the control plane. An operation that ended the workload itself (a
// checkpoint, a terminate) left another record: nothing is done then.
func (m *slotMachine) exited(s *slot, rec slotRecord, exit runtime.Exit) {
	s.lock()
	defer s.unlock()
	cur := s.current()
	if cur.ActorUID != rec.ActorUID || cur.Operation != rec.Operation || cur.Phase != phaseRunning || cur.Capture != "" {
		return
	}
	log := m.log.With("worker", s.name(), "actor_uid", cur.ActorUID, "operation", cur.Operation)
	ce := m.describeExit(s, cur.ActorUID, exit)
	log.Warn("workload exited", "exit", exits.Describe(ce))
	m.logs.keep(cur.ActorUID, "exited on node %s, worker %s: %s", m.node, s.name(), exits.Describe(ce))
	ctx, cancel := cleanupContext(m.watching)
	defer cancel()
	if err := m.vacate(ctx, s, cur); err != nil {
		log.Error("removing the workload that exited", "err", err)
	}
	body, err := protojson.Marshal(ce)
	if err != nil {
		log.Error("exit not recorded", "err", err)
		return
	}
	freed := s.current()
	freed.Exit = &exitRecord{ActorUID: cur.ActorUID, Operation: cur.Operation, Exit: body}
	s.stage(freed)
	if err := s.commit(nil); err != nil {
		log.Error("exit not recorded", "err", err)
	}
	m.watchers.Go(func() { m.report(s.name(), freed.Exit) })
}

// describeExit is exit with the container's last lines of output: what
// the workload wrote last is read from its FIFOs first.
func (m *slotMachine) describeExit(s *slot, actorUID string, exit runtime.Exit) *torporv1.ContainerExit {
	m.logs.detach(s.name())
	var last []string
	if recs, _, err := m.logs.read(actorUID, actorlog.Filter{Container: exit.Container}, false); err == nil {
		for i := len(recs) - 1; i >= 0 && len(last) < exitOutputLines; i-- {
			if recs[i].GetStream() == torporStream || len(recs[i].GetText()) == 0 {
				continue
			}
			line := recs[i].GetText()
			if len(line) > exitLineBytes {
				line = line[:exitLineBytes]
			}
			last = append([]string{string(line)}, last...)
		}
	}
	if !exit.Known {
		return exits.Unknown(exit.Container, last, time.Now())
	}
	return exits.New(exit.Container, exit.Status, last, time.Now())
}

// exitError is the error of a start or checkpoint of a workload that
// exited: a failed precondition naming the exit. (The operation's record
// keeps its code and words; the control plane learns the exit itself
// from ReportExit.)
func exitError(ce *torporv1.ContainerExit) error {
	return errdefs.New(errdefs.ErrFailedPrecondition, exits.Describe(ce))
}

// recordedExit is the error for an operation on actorUID's workload,
// which exited and freed s, or nil when it did not.
func recordedExit(s *slot, cur slotRecord, actorUID string) error {
	if cur.ActorUID != "" || cur.Exit == nil || cur.Exit.ActorUID != actorUID {
		return nil
	}
	ce := cur.Exit.exit()
	if ce == nil {
		return nil
	}
	return errdefs.Errorf(errdefs.ErrFailedPrecondition, "worker %s: the workload of actor %s exited: %s", s.name(), actorUID, exits.Describe(ce))
}

// report tells the control plane of an exit, until it answered or the
// agent stops (the next agent reports it again: reportRecorded).
func (m *slotMachine) report(worker string, rec *exitRecord) {
	req := &torporv1.ReportExitRequest{Node: m.node, Worker: worker, ActorUid: rec.ActorUID, OperationId: rec.Operation, Exit: rec.exit()}
	log := m.log.With("worker", worker, "actor_uid", rec.ActorUID)
	backoff := retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}.Start()
	for {
		ctx, cancel := context.WithTimeout(m.watching, controlPlaneTimeout)
		_, err := m.exitReports.ReportExit(ctx, connect.NewRequest(req))
		cancel()
		if err == nil {
			log.Info("exit reported to the control plane")
			return
		}
		if refusedReport(errdefs.FromConnect(err)) {
			log.Error("the control plane refused the exit report", "err", err)
			return
		}
		log.Warn("exit report failed; retrying", "err", err)
		if !backoff.Wait(m.watching) {
			return
		}
	}
}

// refusedReport says whether the control plane refused an exit report
// for good: a repeat gets the same answer.
func refusedReport(err error) bool {
	for _, kind := range []error{errdefs.ErrInvalidArgument, errdefs.ErrPermissionDenied, errdefs.ErrFailedPrecondition, errdefs.ErrNotFound, errdefs.ErrUnimplemented} {
		if errors.Is(err, kind) {
			return true
		}
	}
	return false
}

// reportRecorded reports again the exits the slot records hold: a
// previous agent may have stopped before the control plane answered.
func (m *slotMachine) reportRecorded() {
	for _, s := range m.slots {
		if rec := s.current(); rec.ActorUID == "" && rec.Exit != nil {
			m.watchers.Go(func() { m.report(s.name(), rec.Exit) })
		}
	}
}
