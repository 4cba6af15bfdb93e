// Package workflow moves actors through their states: resume, suspend,
// pause and delete, crash handling and recovery. Every step commits its
// intent (the -ING state and an ActorOperation) before calling a node, every
// transition is a compare-and-set on (uid, version, expected state), and a
// restarted control plane re-drives any step it finds in flight (DESIGN
// invariants 1, 2, 3).
package workflow

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// NodeAgent is the part of a node agent's API the workflows call.
type NodeAgent interface {
	Run(context.Context, *connect.Request[torporv1.RunRequest]) (*connect.Response[torporv1.RunResponse], error)
	Checkpoint(context.Context, *connect.Request[torporv1.CheckpointRequest]) (*connect.Response[torporv1.CheckpointResponse], error)
	Restore(context.Context, *connect.Request[torporv1.RestoreRequest]) (*connect.Response[torporv1.RestoreResponse], error)
	Terminate(context.Context, *connect.Request[torporv1.TerminateRequest]) (*connect.Response[torporv1.TerminateResponse], error)
	Stats(context.Context, *connect.Request[torporv1.StatsRequest]) (*connect.Response[torporv1.StatsResponse], error)
	DropCheckpoint(context.Context, *connect.Request[torporv1.DropCheckpointRequest]) (*connect.Response[torporv1.DropCheckpointResponse], error)
}

// Agents finds the agent of a node.
type Agents interface {
	Agent(ctx context.Context, node string) (NodeAgent, error)
}

// Objects removes snapshot files from snapshot storage.
type Objects interface {
	DeleteSnapshot(ctx context.Context, location string) error
}

// Defaults of Options, and of the server flags that set them.
const (
	DefaultHeartbeatTimeout = 15 * time.Second
	DefaultRecoverAfter     = 2 * time.Minute
)

// Options tune the engine.
type Options struct {
	// A node whose last heartbeat is older than this is considered lost.
	HeartbeatTimeout time.Duration
	// An -ING step older than this is re-driven by Recover (another replica
	// may still be running a younger one).
	RecoverAfter time.Duration
	// WorkerNamespace is where workers are registered.
	WorkerNamespace string
	// Registerer receives the engine's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Headroom is, per worker pool, how many workers the idle sweep keeps
	// free by evicting early (keepHeadroom); none by default.
	Headroom map[string]int
	// NodeMemoryFloor is the share of a node's memory, in percent, below
	// which its frozen actors go down the idle ladder (relieveMemory); 0:
	// never.
	NodeMemoryFloor int
}

// Engine runs the actor workflows over a store and the node agents.
type Engine struct {
	store   store.Store
	agents  Agents
	objects Objects
	opts    Options
	log     *slog.Logger
	now     func() time.Time
	hooks   Hooks
	metrics *metrics
	// claiming holds the workers this engine's resumes are claiming.
	claiming claimSet
	// driving holds the steps this engine is driving.
	driving *drivers
	// stopping: StopResuming was called.
	stopping atomic.Bool
	// relieved: the nodes' memory readings relieveMemory acted on.
	relieved relieved
}

// claimSet is the workers that claims of this engine have picked and not
// yet committed or given up. It only steers the scheduler away from a
// worker another resume is about to take (scheduler.Request.Claiming); it
// is never an authority: the claim's compare-and-set on the worker decides.
type claimSet struct {
	mu sync.Mutex
	m  map[string]int
}

func workerKey(w *torporv1.Worker) string {
	return w.GetMetadata().GetSpace() + "/" + w.GetMetadata().GetName()
}

// pick runs pick with the set locked, so two claims never pick the same
// worker for lack of seeing each other, and adds the worker it returns.
// The caller releases it once its claim is committed or abandoned.
func (c *claimSet) pick(pick func(claiming func(*torporv1.Worker) bool) (*torporv1.Worker, error)) (*torporv1.Worker, func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w, err := pick(func(w *torporv1.Worker) bool { return c.m[workerKey(w)] > 0 })
	if err != nil {
		return nil, nil, err
	}
	if c.m == nil {
		c.m = map[string]int{}
	}
	key := workerKey(w)
	c.m[key]++
	return w, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.m[key]--; c.m[key] <= 0 {
			delete(c.m, key)
		}
	}, nil
}

// Hooks let tests interleave deterministically with a workflow. Each runs,
// when set, at the named point.
type Hooks struct {
	// BeforeResumeClaim runs after a resume read the actor, its template
	// and its snapshot, and before it commits its claim.
	BeforeResumeClaim func(actor *torporv1.Actor)
	// AfterResumeClaim runs once the RESUMING intent is committed and
	// before the node is called.
	AfterResumeClaim func(actor *torporv1.Actor)
	// BeforeResumeFinalize runs after the node restored the actor and
	// before RUNNING is committed.
	BeforeResumeFinalize func(actor *torporv1.Actor)
	// AfterCheckpointClaim runs once the SUSPENDING or PAUSING intent is
	// committed and before the node is called.
	AfterCheckpointClaim func(actor *torporv1.Actor)
	// BeforeCheckpointFinalize runs after the node checkpointed the actor
	// and before the snapshot is committed.
	BeforeCheckpointFinalize func(actor *torporv1.Actor)
	// AfterIdleClaim runs once an idle stop or eviction committed its
	// claim and before it reads the actor's activity again.
	AfterIdleClaim func(actor *torporv1.Actor)
	// BeforeLeaseEnd runs once a lease end read the sandbox again, found
	// its lease over, and before it claims the kill or the suspend.
	BeforeLeaseEnd func(actor *torporv1.Actor)
}

// New returns an engine.
func New(st store.Store, agents Agents, objects Objects, opts Options, logger *slog.Logger) *Engine {
	if opts.HeartbeatTimeout == 0 {
		opts.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if opts.RecoverAfter == 0 {
		opts.RecoverAfter = DefaultRecoverAfter
	}
	if opts.WorkerNamespace == "" {
		opts.WorkerNamespace = validate.WorkerNamespace
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Engine{store: st, agents: nodeAgents{agents}, objects: objects, opts: opts, log: logger, now: time.Now, metrics: newMetrics(opts.Registerer), driving: newDrivers()}
}

// SetHooks installs test hooks.
func (e *Engine) SetHooks(h Hooks) { e.hooks = h }

// errRetry makes a workflow start over from a fresh read: a concurrent
// writer changed the actor or the worker between read and claim.
var errRetry = errors.New("concurrent change; retry")

const maxAttempts = 20

func newOperationID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "op-" + hex.EncodeToString(b)
}

// newSnapshotName returns a DNS-label name that sorts by creation time, so
// a list of an actor's snapshots is oldest first (retention relies on it).
// Nanoseconds: an actor's checkpoints are serialized by its states, so two
// of them never share a timestamp, however fast they follow each other.
func newSnapshotName(now time.Time) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("s-%016x-%s", now.UnixNano(), hex.EncodeToString(b))
}

func actorKey(a *torporv1.Actor) string {
	return a.GetMetadata().GetSpace() + "/" + a.GetMetadata().GetName()
}

func (e *Engine) logger(a *torporv1.Actor) *slog.Logger {
	l := e.log.With("actor", actorKey(a), "actor_uid", a.GetMetadata().GetUid())
	if op := a.GetStatus().GetOperation(); op != nil {
		l = l.With("operation", op.GetId(), "kind", op.GetKind().String())
	}
	if w := a.GetStatus().GetWorker(); w != nil {
		l = l.With("worker", w.GetName(), "node", w.GetNode())
	}
	return l
}

// transition is one entry of an actor's history.
type transition struct {
	from, to torporv1.ActorState
	reason   string
	op       *torporv1.ActorOperation
	worker   *torporv1.WorkerRef
	// since, when set, gives the step's duration.
	since time.Time
}

// record appends a transition to the actor's history within tx.
func (e *Engine) record(ctx context.Context, tx store.Tx, actorUID string, t transition) error {
	ev := store.Event{
		ActorUID:    actorUID,
		Time:        e.now(),
		FromState:   t.from,
		ToState:     t.to,
		Reason:      t.reason,
		OperationID: t.op.GetId(),
	}
	if t.worker != nil {
		ev.Worker = t.worker.GetNamespace() + "/" + t.worker.GetName()
	}
	if !t.since.IsZero() {
		ev.Duration = e.now().Sub(t.since)
	}
	return tx.AppendEvent(ctx, ev)
}

// releaseWorker clears w's placement within tx if it still names actorUID;
// a worker already re-used by another actor is left alone.
func releaseWorker(ctx context.Context, tx store.Tx, ref *torporv1.WorkerRef, actorUID string) error {
	return releaseReadWorker(ctx, tx, ref, actorUID, nil, freed{})
}

// freed is what a released worker is left with: the actor and template
// its node keeps it warm for (WorkerStatus.warm_actor_uid,
// warm_template_uid), or the actor an eviction freed it for, reserved
// since at.
type freed struct {
	warmFor      string
	warmTemplate string
	reservedFor  string
	at           time.Time
}

func (f freed) apply(st *torporv1.WorkerStatus) {
	st.Actor, st.WarmActorUid, st.ReservedForActorUid, st.ReserveTime = nil, f.warmFor, f.reservedFor, nil
	st.WarmTemplateUid = f.warmTemplate
	if f.reservedFor != "" {
		st.ReserveTime = timestamppb.New(f.at)
	}
}

// releaseReadWorker is releaseWorker given the worker's record as read
// before the transaction (nil: none), and what the freed worker is left
// with. The release compare-and-sets the version read; when the worker
// changed since, it reads it again within tx.
func releaseReadWorker(ctx context.Context, tx store.Tx, ref *torporv1.WorkerRef, actorUID string, read *torporv1.Worker, next freed) error {
	if ref == nil {
		return nil
	}
	if m := read.GetMetadata(); m.GetSpace() == ref.GetNamespace() && m.GetName() == ref.GetName() && read.GetStatus().GetActor().GetUid() == actorUID {
		w := proto.CloneOf(read)
		next.apply(w.Status)
		_, err := tx.Workers().Update(ctx, w)
		if !errors.Is(err, store.ErrConflict) {
			return err
		}
	}
	w, err := tx.Workers().Get(ctx, ref.GetNamespace(), ref.GetName())
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if w.GetStatus().GetActor().GetUid() != actorUID {
		return nil
	}
	next.apply(w.Status)
	_, err = tx.Workers().Update(ctx, w)
	return err
}

// stepEnd is how ending a claimed step went: written is the actor this
// transaction wrote and result what finish returned; or the step ended
// without this call: done is the record another driver of the same step
// finished, lost the record of an actor that moved on (a crash, a delete).
type stepEnd[R any] struct {
	written, done, lost *torporv1.Actor
	result              R
}

// endClaimedStep writes, in tx, the end of a step this engine claimed:
// claimed (the actor as the claim left it) with finish applied, under the
// claim's version, without reading the actor first. When the actor changed
// since the claim, the stored record decides: still in this step (same
// uid, state and operation), finish applies to it; finishedElsewhere(cur)
// says another driver of the step finished it; anything else is lost, and
// nothing is written over it (invariant 2).
func endClaimedStep[R any](ctx context.Context, tx store.Tx, claimed *torporv1.Actor, finish func(*torporv1.Actor) (R, error), finishedElsewhere func(cur *torporv1.Actor) bool) (stepEnd[R], error) {
	next := proto.CloneOf(claimed)
	result, err := finish(next)
	if err != nil {
		return stepEnd[R]{}, err
	}
	written, err := tx.Actors().Update(ctx, next)
	if !errors.Is(err, store.ErrConflict) {
		return stepEnd[R]{written: written, result: result}, err
	}
	cur, err := tx.Actors().Get(ctx, claimed.GetMetadata().GetSpace(), claimed.GetMetadata().GetName())
	if err != nil {
		return stepEnd[R]{}, err
	}
	st, was := cur.GetStatus(), claimed.GetStatus()
	if cur.GetMetadata().GetUid() != claimed.GetMetadata().GetUid() || st.GetState() != was.GetState() || st.GetOperation().GetId() != was.GetOperation().GetId() {
		if finishedElsewhere(cur) {
			return stepEnd[R]{done: cur}, nil
		}
		return stepEnd[R]{lost: cur}, nil
	}
	if result, err = finish(cur); err != nil {
		return stepEnd[R]{}, err
	}
	if written, err = tx.Actors().Update(ctx, cur); err != nil {
		return stepEnd[R]{}, err
	}
	return stepEnd[R]{written: written, result: result}, nil
}

// waitForChange polls the actor until its version moves past version, so
// a caller that found a step in flight can act on its outcome.
func (e *Engine) waitForChange(ctx context.Context, space, name string, version int64) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		a, err := e.store.Actors().Get(ctx, space, name)
		if err != nil {
			return err
		}
		if a.GetMetadata().GetVersion() != version {
			return nil
		}
	}
}
