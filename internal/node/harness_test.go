package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
)

// registry is a control plane's NodeService reduced to what an agent
// calls: it remembers registrations and counts heartbeats.
type registry struct {
	torporv1connect.UnimplementedNodeServiceHandler
	mu         sync.Mutex
	nodes      map[string]*torporv1.RegisterNodeRequest
	heartbeats map[string]int
	changed    chan struct{}
	// placements, when set, is the actor uid each worker hosts as far as
	// the control plane knows (answered as worker status).
	placements map[string]string
}

func newRegistry(t testing.TB) (*registry, string) {
	r := &registry{nodes: map[string]*torporv1.RegisterNodeRequest{}, heartbeats: map[string]int{}, changed: make(chan struct{}, 100)}
	mux := http.NewServeMux()
	mux.Handle(torporv1connect.NewNodeServiceHandler(r))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return r, srv.URL
}

func (r *registry) RegisterNode(_ context.Context, req *connect.Request[torporv1.RegisterNodeRequest]) (*connect.Response[torporv1.RegisterNodeResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := req.Msg.GetNode().GetMetadata().GetName()
	r.nodes[name] = proto.Clone(req.Msg).(*torporv1.RegisterNodeRequest)
	resp := &torporv1.RegisterNodeResponse{Node: req.Msg.GetNode()}
	for _, w := range req.Msg.GetWorkers() {
		w = proto.Clone(w).(*torporv1.Worker)
		w.Metadata.Uid = "uid-" + w.GetMetadata().GetName()
		if r.placements != nil {
			w.Status = &torporv1.WorkerStatus{}
			if uid := r.placements[w.GetMetadata().GetName()]; uid != "" {
				w.Status.Actor = &torporv1.ActorRef{Uid: uid}
			}
		}
		resp.Workers = append(resp.Workers, w)
	}
	r.changed <- struct{}{}
	return connect.NewResponse(resp), nil
}

func (r *registry) Heartbeat(_ context.Context, req *connect.Request[torporv1.HeartbeatRequest]) (*connect.Response[torporv1.HeartbeatResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes[req.Msg.GetNode()] == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("node "+req.Msg.GetNode()+" is not registered"))
	}
	r.heartbeats[req.Msg.GetNode()]++
	r.changed <- struct{}{}
	return connect.NewResponse(&torporv1.HeartbeatResponse{HeartbeatTime: timestamppb.Now()}), nil
}

// forget drops a node, as a control plane that lost its record (or gave
// up on the node) would, and sets the placements it answers with.
func (r *registry) forget(node string, placements map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.nodes, node)
	r.placements = placements
}

func (r *registry) registration(node string) *torporv1.RegisterNodeRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nodes[node]
}

// waitFor polls cond until it holds or a minute passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// running is an agent serving on a loopback port.
type running struct {
	agent  *Agent
	client torporv1connect.NodeAgentServiceClient
	url    string
	stop   func() error
}

// startAgent runs an agent for cfg (Listener, ServerURL and Logger filled
// in when unset) until the test ends or stop is called.
func startAgent(t testing.TB, cfg Config) *running {
	t.Helper()
	if cfg.Listener == nil {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listener = ln
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	t.Cleanup(func() { stop() })
	url := "http://" + cfg.Listener.Addr().String()
	r := &running{agent: a, client: torporv1connect.NewNodeAgentServiceClient(http.DefaultClient, url), url: url, stop: stop}
	waitFor(t, "the agent to serve", func() bool {
		select {
		case err := <-done:
			t.Fatalf("agent stopped: %v", err)
		default:
		}
		resp, err := http.Get(url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return r
}

// testLogger logs to the test's output when -v is given.
func testLogger(t testing.TB) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func op(actorUID, opID, worker string) *torporv1.Operation {
	return &torporv1.Operation{ActorUid: actorUID, OperationId: opID, Worker: worker}
}

func wantCode(t testing.TB, err error, code connect.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("call succeeded, want %s", code)
	}
	if got := connect.CodeOf(err); got != code {
		t.Fatalf("error code %s (%v), want %s", got, err, code)
	}
}
