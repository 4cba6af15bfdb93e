package e2b

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
)

// fakeAPI stands in for Torpor's connect API: spaces, sandboxes and
// actors in memory, with the gate's two rules the gateway relies on (a
// known bearer token; the request names the token's space).
type fakeAPI struct {
	torporv1connect.UnimplementedSandboxServiceHandler
	torporv1connect.UnimplementedActorServiceHandler
	torporv1connect.UnimplementedSpaceServiceHandler

	mu sync.Mutex
	// keys: token → the spaces it gives access to.
	keys map[string][]string
	// actors by space/name.
	actors map[string]*torporv1.Actor
	// fail answers the named procedure (e.g. "CreateSandbox") with an
	// error.
	fail map[string]error
	// calls are the requests received, by procedure.
	calls  map[string][]proto.Message
	nextID int
}

const (
	keyA   = "e2b_aaaa"
	spaceA = "team-a"
	keyB   = "e2b_bbbb"
	spaceB = "team-b"
)

func newFakeAPI() *fakeAPI {
	return &fakeAPI{
		keys:   map[string][]string{keyA: {spaceA}, keyB: {spaceB}, "admin": {spaceA, spaceB}, "e2b_empty": nil},
		actors: map[string]*torporv1.Actor{},
		fail:   map[string]error{},
		calls:  map[string][]proto.Message{},
	}
}

// serve starts the fake's handlers on an HTTP server and returns a
// gateway calling it.
func (f *fakeAPI) serve(t *testing.T, now time.Time) *Gateway {
	t.Helper()
	srv := httptest.NewServer(f.handler())
	t.Cleanup(srv.Close)
	return New(Config{APIURL: srv.URL, HTTPClient: srv.Client(), Domain: "actors.localhost:7080", Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }})
}

// handler serves the fake's connect services.
func (f *fakeAPI) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(torporv1connect.NewSandboxServiceHandler(f))
	mux.Handle(torporv1connect.NewActorServiceHandler(f))
	mux.Handle(torporv1connect.NewSpaceServiceHandler(f))
	return mux
}

// sandboxActor is a sandbox of space as the server stores it.
func sandboxActor(space, id string, state torporv1.ActorState, labels map[string]string) *torporv1.Actor {
	start := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	return &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Name: id, Space: space, Uid: "uid-" + id, Labels: labels},
		Spec: &torporv1.ActorSpec{
			Template:        "base",
			EnvdAccessToken: "envd-" + id,
			Sandbox: &torporv1.Sandbox{
				StartTime: timestamppb.New(start), EndTime: timestamppb.New(start.Add(5 * time.Minute)),
				AutoPause: true, AutoResume: false, TimeoutSeconds: 300,
			},
		},
		Status: &torporv1.ActorStatus{
			State:               state,
			Worker:              &torporv1.WorkerRef{Node: "node1"},
			CurrentTemplateSpec: &torporv1.TemplateSpec{Resources: &torporv1.Resources{CpuMillis: 1500, MemoryMb: 512}},
		},
	}
}

func (f *fakeAPI) put(a *torporv1.Actor) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actors[a.GetMetadata().GetSpace()+"/"+a.GetMetadata().GetName()] = a
}

// check is the fake's gate and bookkeeping: it records the call and
// refuses it as the server would.
func (f *fakeAPI) check(procedure string, h http.Header, space string, msg proto.Message, spaced bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[procedure] = append(f.calls[procedure], msg)
	token, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	spaces, known := f.keys[token]
	if !ok || !known {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("the API token is invalid or expired"))
	}
	if spaced && !slices.Contains(spaces, space) {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("the token gives no access to space %q", space))
	}
	if err := f.fail[procedure]; err != nil {
		return err
	}
	return nil
}

func (f *fakeAPI) lookup(space, name string) (*torporv1.Actor, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.actors[space+"/"+name]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("actor %s/%s not found", space, name))
	}
	return a, nil
}

func (f *fakeAPI) ListSpaces(_ context.Context, req *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListSpacesResponse], error) {
	if err := f.check("ListSpaces", req.Header(), "", req.Msg, false); err != nil {
		return nil, err
	}
	token, _ := strings.CutPrefix(req.Header().Get("Authorization"), "Bearer ")
	resp := &torporv1.ListSpacesResponse{}
	for _, s := range f.keys[token] {
		resp.Spaces = append(resp.Spaces, &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: s}})
	}
	return connect.NewResponse(resp), nil
}

func (f *fakeAPI) CreateSandbox(_ context.Context, req *connect.Request[torporv1.CreateSandboxRequest]) (*connect.Response[torporv1.Actor], error) {
	m := req.Msg
	if err := f.check("CreateSandbox", req.Header(), m.GetSpace(), m, true); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.nextID++
	id := "sbx" + strconv.Itoa(f.nextID)
	f.mu.Unlock()
	a := sandboxActor(m.GetSpace(), id, torporv1.ActorState_ACTOR_STATE_RUNNING, m.GetLabels())
	a.Spec.Template = m.GetTemplate()
	if !m.GetSecure() {
		a.Spec.EnvdAccessToken = ""
	}
	f.put(a)
	return connect.NewResponse(a), nil
}

func (f *fakeAPI) ConnectSandbox(_ context.Context, req *connect.Request[torporv1.ConnectSandboxRequest]) (*connect.Response[torporv1.ConnectSandboxResponse], error) {
	m := req.Msg
	if err := f.check("ConnectSandbox", req.Header(), m.GetSpace(), m, true); err != nil {
		return nil, err
	}
	a, err := f.lookup(m.GetSpace(), m.GetSandboxId())
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	resumed := a.Status.State != torporv1.ActorState_ACTOR_STATE_RUNNING
	a.Status.State = torporv1.ActorState_ACTOR_STATE_RUNNING
	return connect.NewResponse(&torporv1.ConnectSandboxResponse{Actor: a, Resumed: resumed}), nil
}

func (f *fakeAPI) SetSandboxTimeout(_ context.Context, req *connect.Request[torporv1.SetSandboxTimeoutRequest]) (*connect.Response[torporv1.Actor], error) {
	m := req.Msg
	if err := f.check("SetSandboxTimeout", req.Header(), m.GetSpace(), m, true); err != nil {
		return nil, err
	}
	a, err := f.lookup(m.GetSpace(), m.GetSandboxId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(a), nil
}

// ListSandboxes pages by sandbox ID; a page token is the index to go on
// from.
func (f *fakeAPI) ListSandboxes(_ context.Context, req *connect.Request[torporv1.ListSandboxesRequest]) (*connect.Response[torporv1.ListSandboxesResponse], error) {
	m := req.Msg
	if err := f.check("ListSandboxes", req.Header(), m.GetSpace(), m, true); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var matched []*torporv1.Actor
	for _, a := range f.actors {
		if a.GetMetadata().GetSpace() != m.GetSpace() || a.GetSpec().GetSandbox() == nil {
			continue
		}
		if len(m.GetStates()) > 0 && !slices.Contains(m.GetStates(), a.GetStatus().GetState()) {
			continue
		}
		ok := true
		for k, v := range m.GetLabels() {
			if a.GetMetadata().GetLabels()[k] != v {
				ok = false
			}
		}
		if ok {
			matched = append(matched, a)
		}
	}
	sort.Slice(matched, func(i, j int) bool { return matched[i].GetMetadata().GetName() < matched[j].GetMetadata().GetName() })
	from := 0
	if t := m.GetPageToken(); t != "" {
		from, _ = strconv.Atoi(t)
	}
	to := len(matched)
	if n := int(m.GetPageSize()); n > 0 && from+n < to {
		to = from + n
	}
	resp := &torporv1.ListSandboxesResponse{Actors: matched[min(from, len(matched)):to]}
	if to < len(matched) {
		resp.NextPageToken = strconv.Itoa(to)
	}
	return connect.NewResponse(resp), nil
}

func (f *fakeAPI) GetActor(_ context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error) {
	m := req.Msg
	if err := f.check("GetActor", req.Header(), m.GetSpace(), m, true); err != nil {
		return nil, err
	}
	a, err := f.lookup(m.GetSpace(), m.GetName())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(a), nil
}

func (f *fakeAPI) DeleteActor(_ context.Context, req *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	m := req.Msg
	if err := f.check("DeleteActor", req.Header(), m.GetSpace(), m, true); err != nil {
		return nil, err
	}
	a, err := f.lookup(m.GetSpace(), m.GetName())
	if err != nil {
		return nil, err
	}
	if m.GetUid() != "" && m.GetUid() != a.GetMetadata().GetUid() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("uid does not match"))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.actors, m.GetSpace()+"/"+m.GetName())
	return connect.NewResponse(&torporv1.DeleteResponse{}), nil
}

func (f *fakeAPI) SuspendActor(_ context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error) {
	m := req.Msg
	if err := f.check("SuspendActor", req.Header(), m.GetSpace(), m, true); err != nil {
		return nil, err
	}
	a, err := f.lookup(m.GetSpace(), m.GetName())
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	a.Status.State = torporv1.ActorState_ACTOR_STATE_SUSPENDED
	return connect.NewResponse(a), nil
}

func (f *fakeAPI) GetActorStats(_ context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.ActorStats], error) {
	m := req.Msg
	if err := f.check("GetActorStats", req.Header(), m.GetSpace(), m, true); err != nil {
		return nil, err
	}
	a, err := f.lookup(m.GetSpace(), m.GetName())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ActorStats{
		State:       a.GetStatus().GetState(),
		Started:     a.GetSpec().GetSandbox().GetStartTime(),
		CpuSeconds:  90,
		MemoryBytes: 100 << 20,
	}), nil
}

// calledWith returns the requests procedure received.
func (f *fakeAPI) calledWith(procedure string) []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls[procedure])
}
