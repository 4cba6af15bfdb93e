package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// opKey names one operation: node calls are idempotent on it.
type opKey struct{ actorUID, operationID string }

func (k opKey) String() string { return k.actorUID + "/" + k.operationID }

// opRecord is the durable outcome of a finished operation, returned again
// to any retry of it.
type opRecord struct {
	ActorUID    string          `json:"actorUid"`
	OperationID string          `json:"operationId"`
	Method      string          `json:"method"`
	Worker      string          `json:"worker"`
	Finished    time.Time       `json:"finished"`
	Response    json.RawMessage `json:"response,omitempty"`
	Code        connect.Code    `json:"code,omitempty"`
	Message     string          `json:"message,omitempty"`
}

func (r *opRecord) key() opKey { return opKey{r.ActorUID, r.OperationID} }

// result decodes the recorded outcome into resp, or returns the recorded
// error, of the kind its code stands for.
func (r *opRecord) result(method string, resp proto.Message) error {
	if r.Method != method {
		return errdefs.Errorf(errdefs.ErrFailedPrecondition, "operation %s was a %s, not a %s: operation ids must not be reused", r.key(), r.Method, method)
	}
	if r.Code != 0 {
		return errdefs.FromCode(r.Code, r.Message)
	}
	if err := protojson.Unmarshal(r.Response, resp); err != nil {
		return fmt.Errorf("recorded response of operation %s: %w", r.key(), err)
	}
	return nil
}

func newOpRecord(key opKey, method, worker string, resp proto.Message, err error) (*opRecord, error) {
	rec := &opRecord{ActorUID: key.actorUID, OperationID: key.operationID, Method: method, Worker: worker, Finished: time.Now().UTC()}
	if err != nil {
		rec.Code, rec.Message = errdefs.Code(err), errorMessage(err)
		return rec, nil
	}
	body, merr := protojson.Marshal(resp)
	if merr != nil {
		return nil, fmt.Errorf("encode response of operation %s: %w", key, merr)
	}
	rec.Response = body
	return rec, nil
}

// recordable says whether a failed operation's error is its final
// outcome. An operation cut short by the agent stopping is not: its retry
// must run it again.
func recordable(err error) bool {
	switch errdefs.Code(err) {
	case connect.CodeCanceled, connect.CodeUnavailable:
		return false
	}
	return !errors.Is(err, context.Canceled)
}

func errorMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// journal keeps finished operations' records under dir/<actor uid>/<op id>.json.
type journal struct{ dir string }

func (j journal) path(k opKey) string {
	return filepath.Join(j.dir, k.actorUID, k.operationID+".json")
}

// get returns the record of k, or nil when there is none.
func (j journal) get(k opKey) (*opRecord, error) {
	var rec opRecord
	err := readJSON(j.path(k), &rec)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("operation journal: %w", err)
	}
	return &rec, nil
}

func (j journal) put(rec *opRecord) error {
	if err := writeJSON(j.path(rec.key()), rec); err != nil {
		return fmt.Errorf("operation journal: record %s: %w", rec.key(), err)
	}
	return nil
}

// prune removes records finished before cutoff: a control plane retries an
// operation within minutes, never after days.
func (j journal) prune(cutoff time.Time) error {
	actors, err := os.ReadDir(j.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("operation journal: %w", err)
	}
	var errs []error
	for _, actor := range actors {
		dir := filepath.Join(j.dir, actor.Name())
		entries, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		kept := 0
		for _, e := range entries {
			info, err := e.Info()
			if err != nil || info.ModTime().Before(cutoff) || strings.HasPrefix(e.Name(), ".") {
				errs = append(errs, ignoreNotExist(os.Remove(filepath.Join(dir, e.Name()))))
				continue
			}
			kept++
		}
		if kept == 0 {
			errs = append(errs, ignoreNotExist(os.Remove(dir)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("operation journal: prune: %w", err)
	}
	return nil
}

func ignoreNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// call is one operation in flight; duplicates wait on done.
type call struct {
	done chan struct{}
	rec  *opRecord // the outcome, when recorded
	err  error     // an outcome that was not recorded
}

// operate runs fn for op once, however often and however concurrently the
// call is repeated: a duplicate in flight waits for the first, a repeat of
// a finished operation gets its recorded outcome. fn runs with the slot
// locked and without the caller's cancellation, so a caller that gives up
// does not leave the slot half-changed; its retry finds the outcome. fn
// reports the slot's new state through s.stage; operate persists it
// together with the outcome in one write. The operation's own deadline is
// Config.OperationTimeout.
func operate[T any, P interface {
	*T
	proto.Message
}](ctx context.Context, m *slotMachine, method string, op *torporv1.Operation, fn func(ctx context.Context, s *slot) (P, error)) (P, error) {
	if err := validateOperation(op); err != nil {
		return nil, err
	}
	s, err := m.slot(op.GetWorker())
	if err != nil {
		return nil, err
	}
	key := opKey{op.GetActorUid(), op.GetOperationId()}
	m.mu.Lock()
	c := m.inflight[key]
	if c == nil {
		c = &call{done: make(chan struct{})}
		m.inflight[key] = c
		m.ops.Go(func() {
			opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.timeout)
			defer cancel()
			m.execute(opCtx, key, method, s, func(ctx context.Context) (proto.Message, error) { return fn(ctx, s) }, func(rec *opRecord, err error) {
				c.rec, c.err = rec, err
				m.mu.Lock()
				delete(m.inflight, key)
				m.mu.Unlock()
				close(c.done)
			})
		})
	}
	m.mu.Unlock()
	select {
	case <-c.done:
	case <-ctx.Done():
		return nil, errdefs.Errorf(context.Canceled, "operation %s goes on without its caller: %w", key, context.Cause(ctx))
	}
	if c.err != nil {
		return nil, c.err
	}
	resp := P(new(T))
	if err := c.rec.result(method, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// execute finds the recorded outcome of key or runs fn and records it,
// and hands the outcome to publish as soon as it is durable.
func (m *slotMachine) execute(ctx context.Context, key opKey, method string, s *slot, fn func(ctx context.Context) (proto.Message, error), publish func(*opRecord, error)) {
	if rec, err := m.journal.get(key); rec != nil || err != nil {
		publish(rec, err)
		return
	}
	s.lock()
	defer s.unlock()
	// The slot's last outcome may not be in the journal yet.
	if last := s.current().LastOp; last != nil && last.key() == key {
		publish(last, nil)
		return
	}
	if rec, err := m.journal.get(key); rec != nil || err != nil {
		publish(rec, err)
		return
	}
	log := m.log.With("method", method, "operation", key.operationID, "actor_uid", key.actorUID, "worker", s.name())
	start := time.Now()
	resp, err := fn(ctx)
	m.metrics.observe(method, start, err)
	if err != nil && !recordable(err) {
		if cerr := s.commit(nil); cerr != nil {
			log.Error("slot state not recorded", "err", cerr)
		}
		log.Warn("operation interrupted", "err", err, "duration", time.Since(start))
		publish(nil, err)
		return
	}
	rec, rerr := newOpRecord(key, method, s.name(), resp, err)
	if rerr == nil {
		rerr = s.commit(rec)
	}
	if rerr != nil {
		log.Error("operation outcome not recorded", "err", rerr)
		publish(nil, rerr)
		return
	}
	if err != nil {
		log.Warn("operation failed", "code", errdefs.Code(err).String(), "err", err, "duration", time.Since(start))
	} else {
		log.Info("operation done", "duration", time.Since(start))
	}
	publish(rec, nil)
	// The slot record holds the outcome durably already; the journal keeps
	// it for when the slot's next operation replaces it. Writing it after
	// publishing keeps it off the caller's path; a crash before it is
	// repaired at startup.
	if err := m.journal.put(rec); err != nil {
		log.Warn("journal write failed; the slot record keeps the outcome", "err", err)
	}
}
