package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/encoding/protojson"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime"
)

// phase is where a slot's workload is in its life. A slot's record is
// written when an operation ends, so a crash mid-operation leaves the
// state from before it, and the restart undoes what the operation had
// begun (see reconcile). On disk, a slot is free, running, or stopping:
// a workload that would not stop, kept from other actors until it does,
// or one whose checkpoint began (Capture) and may have ended it.
type phase string

const (
	phaseFree     phase = ""
	phaseStarting phase = "starting" // run or restore in progress
	phaseRunning  phase = "running"
	phaseStopping phase = "stopping" // checkpoint or terminate in progress
)

// slotRecord is what a slot durably remembers: which actor occupies it and
// the outcome of its last operation.
type slotRecord struct {
	ActorUID  string `json:"actorUid,omitempty"`
	Phase     phase  `json:"phase,omitempty"`
	Operation string `json:"operation,omitempty"`
	// Workload is the occupant as the control plane described it
	// (protojson), kept for checkpoints (its volumes) and adoption.
	Workload json.RawMessage `json:"workload,omitempty"`
	LastOp   *opRecord       `json:"lastOp,omitempty"`
	// Capture is, while a checkpoint that ends the workload runs, its
	// operation id. It is on disk before the capture begins: a sandbox
	// finishes a capture it started even if the agent dies, and then
	// exits, so a restarted agent that finds the workload gone keeps the
	// actor's volumes and the capture's stage directory for the retry of
	// that operation to finish (see checkpoint). A capture whose storing
	// met a fault that passes is kept the same way.
	Capture string `json:"capture,omitempty"`
	// Warm is, on a free slot, the workload (protojson) its runtime
	// sandbox was made ready for ahead of time (see warm.go), so a
	// restarted agent can make it again if the sandbox is gone.
	Warm json.RawMessage `json:"warm,omitempty"`
	// Exit is, on a slot freed because its workload exited, that exit
	// (exits.go), kept until the slot's next workload.
	Exit *exitRecord `json:"exit,omitempty"`
}

func (r slotRecord) workload() (*torporv1.Workload, error) {
	w := &torporv1.Workload{}
	if len(r.Workload) == 0 {
		return w, nil
	}
	if err := protojson.Unmarshal(r.Workload, w); err != nil {
		return nil, fmt.Errorf("workload of actor %s: %w", r.ActorUID, err)
	}
	return w, nil
}

// admits is the actor whose connections the slot gate lets through:
// none while the workload is being stopped (a checkpoint's capture, a
// terminate), since what a request changed then would be lost with it;
// its requests wait for the resume instead. (A checkpoint that leaves the
// workload running, which the control plane does not ask for, cuts its
// connections too.)
func (r slotRecord) admits() string {
	if r.Phase == phaseStopping {
		return ""
	}
	return r.ActorUID
}

// occupied returns the record of w running (or about to run) for op.
func occupied(ph phase, op *torporv1.Operation, w *torporv1.Workload) (slotRecord, error) {
	body, err := protojson.Marshal(w)
	if err != nil {
		return slotRecord{}, fmt.Errorf("encode workload of actor %s: %w", op.GetActorUid(), err)
	}
	return slotRecord{ActorUID: op.GetActorUid(), Phase: ph, Operation: op.GetOperationId(), Workload: body}, nil
}

// slot is one worker: its sandbox place, its lock and its record.
type slot struct {
	rt   runtime.Slot
	file string
	// sem serializes the slot's operations.
	sem chan struct{}

	// outOfService holds the slot back from registration while what a
	// previous run left in it cannot be removed (clearOrQuarantine).
	outOfService atomic.Bool

	mu  sync.Mutex
	rec slotRecord // the current state; on disk once committed
	// after runs once the next commit is durable (see afterCommit).
	after []func()
	// occupy tells the slot gate which actor to admit (admits) whenever
	// the state in memory changes: a claim closes the connections
	// admitted for the previous actor before the new workload starts.
	occupy func(rec slotRecord)
	// watch watches the workload running here for its exit (exits.go).
	watch *exitWatch
}

func newSlot(rt runtime.Slot, file string) *slot {
	return &slot{rt: rt, file: file, sem: make(chan struct{}, 1)}
}

func (s *slot) name() string { return s.rt.Name }

func (s *slot) lock()   { s.sem <- struct{}{} }
func (s *slot) unlock() { <-s.sem }

// tryLock locks the slot if no operation holds it.
func (s *slot) tryLock() bool {
	select {
	case s.sem <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s *slot) current() slotRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec
}

// stage sets the slot's state in memory (keeping its last outcome);
// commit writes it.
func (s *slot) stage(rec slotRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec.LastOp = s.rec.LastOp
	s.rec = rec
	s.occupy(rec)
}

// afterCommit makes fn run right after the slot's next successful commit,
// with the slot still locked: it discards what a retry of the operation
// would need until its outcome is on disk (a capture's stage directory,
// the actor's volumes, a local checkpoint a restore started from). A
// failed commit drops fn: the record on disk still claims what fn would
// have discarded.
func (s *slot) afterCommit(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.after = append(s.after, fn)
}

// commit writes the current state, with last as the slot's last outcome
// when set.
func (s *slot) commit(last *opRecord) error {
	s.mu.Lock()
	rec, after := s.rec, s.after
	s.after = nil
	s.mu.Unlock()
	if last != nil {
		rec.LastOp = last
	}
	if err := writeJSON(s.file, rec); err != nil {
		return fmt.Errorf("worker %s: record: %w", s.name(), err)
	}
	s.mu.Lock()
	s.rec = rec
	s.mu.Unlock()
	for _, fn := range after {
		fn()
	}
	return nil
}

// load reads the slot's record; a slot never written is free.
func (s *slot) load() error {
	var rec slotRecord
	err := readJSON(s.file, &rec)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("worker %s: %w", s.name(), err)
	}
	s.mu.Lock()
	s.rec = rec
	s.occupy(rec)
	s.mu.Unlock()
	return nil
}

// currentWatch is the watch of the workload running in s, if any.
func (s *slot) currentWatch() *exitWatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.watch
}
