package workflow

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// fakeAgent is a node agent double for unit tests: it keeps one workload
// per worker, records calls, deduplicates on (actor uid, operation id) like
// a real agent, and fails on request.
type fakeAgent struct {
	node string
	mu   sync.Mutex
	// slots: worker name -> actor uid running there.
	slots map[string]string
	done  map[string]bool
	calls []string
	// failRestore, when set, is returned by the next Restore.
	failRestore    error
	failCheckpoint error
	// noData makes checkpoints report no durable data.
	noData   bool
	restores []*torporv1.RestoreRequest
	// checkpoints are the Checkpoint calls' requests, in order.
	checkpoints []*torporv1.CheckpointRequest
	// dropped are the locations of DropCheckpoint calls, in order.
	dropped []string
	// down makes every call fail as a node that does not answer does;
	// unanswered counts those calls.
	down       atomic.Bool
	unanswered atomic.Int64
	// warm: worker name -> the template uid it was warmed for (Warm);
	// a restore of that template there reports it started warm.
	warm map[string]string
	// workloads are the workloads of the Run, Restore and Warm calls, in
	// order, by method.
	workloads []sentWorkload
}

type sentWorkload struct {
	method   string
	workload *torporv1.Workload
}

// sent records a workload sent by method.
func (f *fakeAgent) sent(method string, w *torporv1.Workload) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.workloads = append(f.workloads, sentWorkload{method, w})
}

// unreachable is what a call of a node that is down returns.
func (f *fakeAgent) unreachable() error {
	if !f.down.Load() {
		return nil
	}
	f.unanswered.Add(1)
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("dial node %s: connection refused", f.node))
}

func (f *fakeAgent) lastRestore() *torporv1.RestoreRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.restores) == 0 {
		return nil
	}
	return f.restores[len(f.restores)-1]
}

// checkpointsOf are the requests of the Checkpoint calls for actorUID,
// in order.
func (f *fakeAgent) checkpointsOf(actorUID string) []*torporv1.CheckpointRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*torporv1.CheckpointRequest
	for _, c := range f.checkpoints {
		if c.GetOp().GetActorUid() == actorUID {
			out = append(out, c)
		}
	}
	return out
}

func newFakeAgent(node string) *fakeAgent {
	return &fakeAgent{node: node, slots: map[string]string{}, done: map[string]bool{}, warm: map[string]string{}}
}

func (f *fakeAgent) callCount(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == method {
			n++
		}
	}
	return n
}

// start runs op's workload once per operation id.
func (f *fakeAgent) start(method string, op *torporv1.Operation, fail *error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := op.GetActorUid() + "/" + op.GetOperationId()
	if f.done[key] {
		return nil
	}
	f.calls = append(f.calls, method)
	if *fail != nil {
		err := *fail
		*fail = nil
		return err
	}
	if cur := f.slots[op.GetWorker()]; cur != "" && cur != op.GetActorUid() {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("worker %s runs actor %s", op.GetWorker(), cur))
	}
	f.slots[op.GetWorker()] = op.GetActorUid()
	f.done[key] = true
	return nil
}

// Warm records the worker warm for the workload's template, as a node
// does unless the worker is busy.
func (f *fakeAgent) Warm(_ context.Context, req *connect.Request[torporv1.WarmRequest]) (*connect.Response[torporv1.WarmResponse], error) {
	if err := f.unreachable(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "Warm")
	f.workloads = append(f.workloads, sentWorkload{"Warm", req.Msg.GetWorkload()})
	if cur := f.slots[req.Msg.GetWorker()]; cur != "" {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("worker %s hosts actor %s", req.Msg.GetWorker(), cur))
	}
	f.warm[req.Msg.GetWorker()] = req.Msg.GetWorkload().GetTemplateUid()
	return connect.NewResponse(&torporv1.WarmResponse{}), nil
}

// startedWarm reports whether a start of template on worker finds it
// warm for that template, and uses up the warm sandbox.
func (f *fakeAgent) startedWarm(worker, template string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	warm := f.warm[worker] == template
	delete(f.warm, worker)
	return warm
}

func (f *fakeAgent) Run(_ context.Context, req *connect.Request[torporv1.RunRequest]) (*connect.Response[torporv1.RunResponse], error) {
	if err := f.unreachable(); err != nil {
		return nil, err
	}
	f.sent("Run", req.Msg.GetWorkload())
	var none error
	if err := f.start("Run", req.Msg.GetOp(), &none); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.RunResponse{}), nil
}

// fakeRestoreSteps and fakeCheckpointSteps are the steps every fake
// restore and checkpoint reports.
var (
	fakeRestoreSteps    = []*torporv1.StepDuration{{Name: "fetch", DurationUs: 1300}, {Name: "start", DurationUs: 70_000}}
	fakeCheckpointSteps = []*torporv1.StepDuration{{Name: "capture", DurationUs: 120_000}, {Name: "upload", DurationUs: 410_040}}
)

func (f *fakeAgent) Restore(_ context.Context, req *connect.Request[torporv1.RestoreRequest]) (*connect.Response[torporv1.RestoreResponse], error) {
	if err := f.unreachable(); err != nil {
		return nil, err
	}
	f.sent("Restore", req.Msg.GetWorkload())
	if err := f.start("Restore", req.Msg.GetOp(), &f.failRestore); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.restores = append(f.restores, req.Msg)
	f.mu.Unlock()
	warm := f.startedWarm(req.Msg.GetOp().GetWorker(), req.Msg.GetWorkload().GetTemplateUid())
	return connect.NewResponse(&torporv1.RestoreResponse{Warm: warm, Steps: fakeRestoreSteps}), nil
}

func (f *fakeAgent) Checkpoint(_ context.Context, req *connect.Request[torporv1.CheckpointRequest]) (*connect.Response[torporv1.CheckpointResponse], error) {
	if err := f.unreachable(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "Checkpoint")
	f.checkpoints = append(f.checkpoints, req.Msg)
	if err := f.failCheckpoint; err != nil {
		f.failCheckpoint = nil
		return nil, err
	}
	op := req.Msg.GetOp()
	if f.slots[op.GetWorker()] != op.GetActorUid() && !f.done[op.GetActorUid()+"/"+op.GetOperationId()] {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("worker %s does not run actor %s", op.GetWorker(), op.GetActorUid()))
	}
	delete(f.slots, op.GetWorker())
	f.done[op.GetActorUid()+"/"+op.GetOperationId()] = true
	return connect.NewResponse(&torporv1.CheckpointResponse{Location: req.Msg.GetLocation(), ManifestDigest: "sha256:fake", SizeBytes: 1, HasData: !f.noData, Steps: fakeCheckpointSteps}), nil
}

func (f *fakeAgent) Terminate(_ context.Context, req *connect.Request[torporv1.TerminateRequest]) (*connect.Response[torporv1.TerminateResponse], error) {
	if err := f.unreachable(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "Terminate")
	op := req.Msg.GetOp()
	if f.slots[op.GetWorker()] == op.GetActorUid() {
		delete(f.slots, op.GetWorker())
	}
	return connect.NewResponse(&torporv1.TerminateResponse{}), nil
}

func (f *fakeAgent) Stats(_ context.Context, req *connect.Request[torporv1.StatsRequest]) (*connect.Response[torporv1.StatsResponse], error) {
	if err := f.unreachable(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	uid := f.slots[req.Msg.GetWorker()]
	return connect.NewResponse(&torporv1.StatsResponse{Running: uid != "", ActorUid: uid}), nil
}

// DropCheckpoint records the location: the fake keeps no checkpoint
// files.
func (f *fakeAgent) DropCheckpoint(_ context.Context, req *connect.Request[torporv1.DropCheckpointRequest]) (*connect.Response[torporv1.DropCheckpointResponse], error) {
	if err := f.unreachable(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "DropCheckpoint")
	f.dropped = append(f.dropped, req.Msg.GetLocation())
	return connect.NewResponse(&torporv1.DropCheckpointResponse{}), nil
}

func (f *fakeAgent) droppedCheckpoints() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.dropped)
}

type fakeAgents map[string]*fakeAgent

func (f fakeAgents) Agent(_ context.Context, node string) (NodeAgent, error) {
	a, ok := f[node]
	if !ok {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("node %s unknown", node))
	}
	return a, nil
}

type fakeObjects struct {
	mu      sync.Mutex
	deleted []string
}

func (o *fakeObjects) DeleteSnapshot(_ context.Context, location string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.deleted = append(o.deleted, location)
	return nil
}
