package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/slotgate"
)

// fakeAgent is a node agent double: Run and Restore start the workload as
// an HTTP server on the worker's IP, Checkpoint and Terminate stop it.
// Calls are idempotent on (actor uid, operation id) like a real agent's.
type fakeAgent struct {
	t    testing.TB
	port int
	wl   workload

	mu       sync.Mutex
	running  map[string]*runningWorkload // worker name -> workload
	done     map[string]bool             // actor uid/operation id
	counts   map[string]int
	gates    map[string]chan struct{} // method -> closed to let calls proceed
	entered  map[string]chan struct{} // method -> closed when a call is waiting at its gate
	workerIP map[string]string
	fails    map[string]connect.Code // method -> code its calls fail with
	// gate is the node's slot gate, the real one, told of each worker's
	// actor as a node agent tells it; gateAddr is where it listens.
	slotGate *slotgate.Gate
	gateAddr string
	// stopGate stops the gate's serving (gateDown).
	stopGate func()
}

type runningWorkload struct {
	actorUID string
	srv      *http.Server
	// ln is closed by stop itself: srv.Close closes only the listeners
	// Serve has taken, and Serve's goroutine may not have run yet when a
	// quick stop comes, leaving the address taken for the next start on
	// the worker.
	ln net.Listener
}

func newFakeAgent(t testing.TB, port int, wl workload) *fakeAgent {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAgent{
		t: t, port: port, wl: wl,
		running: map[string]*runningWorkload{}, done: map[string]bool{}, counts: map[string]int{},
		gates: map[string]chan struct{}{}, entered: map[string]chan struct{}{}, workerIP: map[string]string{},
		fails: map[string]connect.Code{}, slotGate: slotgate.New(slog.New(slog.DiscardHandler), slotgate.Options{}), gateAddr: ln.Addr().String(),
	}
	f.serveGate(ln)
	t.Cleanup(func() {
		f.mu.Lock()
		stop := f.stopGate
		f.mu.Unlock()
		stop()
	})
	return f
}

// serveGate serves the slot gate on ln until stopGate.
func (f *fakeAgent) serveGate(ln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- f.slotGate.Serve(ctx, ln) }()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopGate = sync.OnceFunc(func() {
		cancel()
		if err := <-served; err != nil {
			f.t.Errorf("slot gate: %v", err)
		}
	})
}

// gateDown stops the slot gate as a node agent hosting it does when it
// restarts: its connections are cut, new ones refused, until up serves it
// again on its address (knowing the slots it knew).
func (f *fakeAgent) gateDown() (up func()) {
	f.mu.Lock()
	stop := f.stopGate
	f.mu.Unlock()
	stop()
	return func() {
		ln, err := net.Listen("tcp", f.gateAddr)
		if err != nil {
			f.t.Fatalf("slot gate back on %s: %v", f.gateAddr, err)
		}
		f.serveGate(ln)
	}
}

// failWith makes calls of method fail with code and a message as a real
// node's failures read: uids, sandbox ids, host paths, the worker's name
// and address, runtime stderr.
func (f *fakeAgent) failWith(method string, code connect.Code) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fails[method] = code
}

// gate makes calls of method wait until the returned release is called;
// entered is closed once a call waits.
func (f *fakeAgent) gate(method string) (entered <-chan struct{}, release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g, in := make(chan struct{}), make(chan struct{})
	f.gates[method], f.entered[method] = g, in
	var once sync.Once
	return in, func() { once.Do(func() { close(g) }) }
}

func (f *fakeAgent) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[method]
}

// enter counts a call and waits at method's gate, if one is set.
func (f *fakeAgent) enter(ctx context.Context, method string) error {
	f.mu.Lock()
	f.counts[method]++
	g, in := f.gates[method], f.entered[method]
	if g != nil {
		select {
		case <-in:
		default:
			close(in)
		}
	}
	f.mu.Unlock()
	if g == nil {
		return nil
	}
	select {
	case <-g:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeAgent) start(ctx context.Context, method string, op *torporv1.Operation, w *torporv1.Workload) error {
	if err := f.enter(ctx, method); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if code, ok := f.fails[method]; ok {
		return connect.NewError(code, fmt.Errorf("%s: sandbox torpor-%s-%s on worker %s (%s): runsc exited 128: stderr: open /var/lib/torpor/bundles/%s/config.json: permission denied",
			method, op.GetActorUid(), op.GetOperationId(), op.GetWorker(), f.workerIP[op.GetWorker()], op.GetActorUid()))
	}
	key := op.GetActorUid() + "/" + op.GetOperationId()
	if f.done[key] {
		return nil
	}
	if cur := f.running[op.GetWorker()]; cur != nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("worker %s runs actor %s", op.GetWorker(), cur.actorUID))
	}
	rw := &runningWorkload{actorUID: op.GetActorUid()}
	// As a node's claim does, before the workload starts.
	f.slotGate.Occupy(op.GetWorker(), f.workerIP[op.GetWorker()], op.GetActorUid(), slotgate.Freeze{})
	if f.wl != nil {
		ip, err := f.ipOf(op.GetWorker())
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(f.port)))
		if err != nil {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("start workload: %w", err))
		}
		rw.srv, rw.ln = &http.Server{Handler: f.wl(w.GetActor())}, ln
		go func() {
			if err := rw.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				f.t.Errorf("workload of %s: %v", w.GetActor(), err)
			}
		}()
	}
	f.running[op.GetWorker()] = rw
	f.done[key] = true
	return nil
}

// ipOf is the address of one of the agent's workers, as registered.
func (f *fakeAgent) ipOf(worker string) (string, error) {
	ip, ok := f.workerIP[worker]
	if !ok {
		return "", connect.NewError(connect.CodeNotFound, fmt.Errorf("worker %s unknown to the agent", worker))
	}
	return ip, nil
}

func (f *fakeAgent) stop(worker, actorUID string) {
	rw := f.running[worker]
	if rw == nil || rw.actorUID != actorUID {
		return
	}
	if rw.srv != nil {
		rw.srv.Close()
		rw.ln.Close()
	}
	delete(f.running, worker)
	f.slotGate.Occupy(worker, f.workerIP[worker], "", slotgate.Freeze{})
}

func (f *fakeAgent) stopAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for w, rw := range f.running {
		f.stop(w, rw.actorUID)
	}
}

func (f *fakeAgent) Run(ctx context.Context, req *connect.Request[torporv1.RunRequest]) (*connect.Response[torporv1.RunResponse], error) {
	if err := f.start(ctx, "Run", req.Msg.GetOp(), req.Msg.GetWorkload()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.RunResponse{}), nil
}

func (f *fakeAgent) Restore(ctx context.Context, req *connect.Request[torporv1.RestoreRequest]) (*connect.Response[torporv1.RestoreResponse], error) {
	if err := f.start(ctx, "Restore", req.Msg.GetOp(), req.Msg.GetWorkload()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.RestoreResponse{}), nil
}

func (f *fakeAgent) Checkpoint(ctx context.Context, req *connect.Request[torporv1.CheckpointRequest]) (*connect.Response[torporv1.CheckpointResponse], error) {
	// As a node does, the gate admits no connection to a workload being
	// stopped.
	f.mu.Lock()
	if op := req.Msg.GetOp(); f.running[op.GetWorker()] != nil && f.running[op.GetWorker()].actorUID == op.GetActorUid() {
		f.slotGate.Occupy(op.GetWorker(), f.workerIP[op.GetWorker()], "", slotgate.Freeze{})
	}
	f.mu.Unlock()
	if err := f.enter(ctx, "Checkpoint"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	op := req.Msg.GetOp()
	key := op.GetActorUid() + "/" + op.GetOperationId()
	if !f.done[key] {
		if rw := f.running[op.GetWorker()]; rw == nil || rw.actorUID != op.GetActorUid() {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("worker %s does not run actor %s", op.GetWorker(), op.GetActorUid()))
		}
		f.stop(op.GetWorker(), op.GetActorUid())
		f.done[key] = true
	}
	return connect.NewResponse(&torporv1.CheckpointResponse{Location: req.Msg.GetLocation(), ManifestDigest: "sha256:fake", SizeBytes: 1, HasData: true}), nil
}

func (f *fakeAgent) Terminate(_ context.Context, req *connect.Request[torporv1.TerminateRequest]) (*connect.Response[torporv1.TerminateResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts["Terminate"]++
	f.stop(req.Msg.GetOp().GetWorker(), req.Msg.GetOp().GetActorUid())
	return connect.NewResponse(&torporv1.TerminateResponse{}), nil
}

func (f *fakeAgent) Stats(_ context.Context, req *connect.Request[torporv1.StatsRequest]) (*connect.Response[torporv1.StatsResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &torporv1.StatsResponse{}
	if rw := f.running[req.Msg.GetWorker()]; rw != nil {
		resp.Running, resp.ActorUid = true, rw.actorUID
	}
	return connect.NewResponse(resp), nil
}

// DropCheckpoint counts the call: the fake keeps no checkpoint files.
func (f *fakeAgent) DropCheckpoint(context.Context, *connect.Request[torporv1.DropCheckpointRequest]) (*connect.Response[torporv1.DropCheckpointResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts["DropCheckpoint"]++
	return connect.NewResponse(&torporv1.DropCheckpointResponse{}), nil
}

// Warm answers as a node with warming off: these tests' templates want
// no warm workers.
func (f *fakeAgent) Warm(context.Context, *connect.Request[torporv1.WarmRequest]) (*connect.Response[torporv1.WarmResponse], error) {
	return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the router tests' node does not warm workers"))
}
