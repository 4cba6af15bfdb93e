package cli

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/validate"
)

// fakePageSize is small so listings cross several pages.
const fakePageSize = 2

// fakeCollection is an in-memory table of one kind, keyed by space/name.
type fakeCollection[T object] struct {
	mu      sync.Mutex
	kind    string
	items   map[string]T
	created time.Time // every object's create_time, so AGE is predictable
	nextUID *int
}

func key(space, name string) string { return space + "/" + name }

func (c *fakeCollection[T]) put(item T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := item.GetMetadata()
	if m.Uid == "" {
		*c.nextUID++
		m.Uid = fmt.Sprintf("uid-%d", *c.nextUID)
	}
	if m.Version == 0 {
		m.Version = 1
	}
	if m.CreateTime == nil {
		m.CreateTime = timestamppb.New(c.created)
	}
	c.items[key(m.GetSpace(), m.GetName())] = item
}

func (c *fakeCollection[T]) create(item T) (T, error) {
	if _, err := c.get(item.GetMetadata().GetSpace(), item.GetMetadata().GetName()); err == nil {
		var zero T
		return zero, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s %s exists", c.kind, key(item.GetMetadata().GetSpace(), item.GetMetadata().GetName())))
	}
	c.put(item)
	return c.get(item.GetMetadata().GetSpace(), item.GetMetadata().GetName())
}

// get returns a copy: handlers encode it while later calls may change the
// stored one.
func (c *fakeCollection[T]) get(space, name string) (T, error) {
	return c.update(space, name, func(T) error { return nil })
}

// update changes a stored object under the lock and returns a copy.
func (c *fakeCollection[T]) update(space, name string, change func(T) error) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	item, ok := c.items[key(space, name)]
	if !ok {
		return item, connect.NewError(connect.CodeNotFound, fmt.Errorf("%s %s not found", c.kind, key(space, name)))
	}
	if err := change(item); err != nil {
		var zero T
		return zero, err
	}
	return proto.Clone(item).(T), nil
}

func (c *fakeCollection[T]) list(req *torporv1.ListRequest) ([]T, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var keys []string
	for k, item := range c.items {
		if req.GetSpace() == "" || item.GetMetadata().GetSpace() == req.GetSpace() {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	start, _ := strconv.Atoi(req.GetPageToken())
	end := min(start+fakePageSize, len(keys))
	var page []T
	for _, k := range keys[start:end] {
		page = append(page, proto.Clone(c.items[k]).(T))
	}
	next := ""
	if end < len(keys) {
		next = strconv.Itoa(end)
	}
	return page, next
}

func (c *fakeCollection[T]) remove(req *torporv1.DeleteRequest) (*torporv1.DeleteResponse, error) {
	if _, err := c.get(req.GetSpace(), req.GetName()); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.items, key(req.GetSpace(), req.GetName()))
	return &torporv1.DeleteResponse{}, nil
}

func (c *fakeCollection[T]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.items)
}

// fakeAPI serves all five client-facing services from memory.
type fakeAPI struct {
	// The revision RPCs are tested against the real server
	// (realserver_test.go).
	torporv1connect.UnimplementedTemplateServiceHandler

	spaces    fakeCollection[*torporv1.Space]
	templates fakeCollection[*torporv1.Template]
	actors    fakeCollection[*torporv1.Actor]
	workers   fakeCollection[*torporv1.Worker]
	snapshots fakeCollection[*torporv1.Snapshot]

	mu      sync.Mutex
	updates []*torporv1.UpdateActorRequest
	resumes []*torporv1.ResumeActorRequest
	// noFreeWorker is how many resumes to refuse for lack of a worker.
	noFreeWorker int
	events       []*torporv1.ActorEvent
}

// created is when the fake says every object was created.
const createdAgo = 3 * time.Hour

// startFakeAPI serves a fresh fake over real HTTP and returns its URL.
func startFakeAPI(t *testing.T) (*fakeAPI, string) {
	t.Helper()
	created := time.Now().Add(-createdAgo).Truncate(time.Second)
	uid := 0
	f := &fakeAPI{
		spaces:    fakeCollection[*torporv1.Space]{kind: "space", items: map[string]*torporv1.Space{}, created: created, nextUID: &uid},
		templates: fakeCollection[*torporv1.Template]{kind: "template", items: map[string]*torporv1.Template{}, created: created, nextUID: &uid},
		actors:    fakeCollection[*torporv1.Actor]{kind: "actor", items: map[string]*torporv1.Actor{}, created: created, nextUID: &uid},
		workers:   fakeCollection[*torporv1.Worker]{kind: "worker", items: map[string]*torporv1.Worker{}, created: created, nextUID: &uid},
		snapshots: fakeCollection[*torporv1.Snapshot]{kind: "snapshot", items: map[string]*torporv1.Snapshot{}, created: created, nextUID: &uid},
	}
	mux := http.NewServeMux()
	mux.Handle(torporv1connect.NewSpaceServiceHandler(f))
	mux.Handle(torporv1connect.NewTemplateServiceHandler(f))
	mux.Handle(torporv1connect.NewActorServiceHandler(f))
	mux.Handle(torporv1connect.NewWorkerServiceHandler(f))
	mux.Handle(torporv1connect.NewSnapshotServiceHandler(f))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func respond[T any](msg *T, err error) (*connect.Response[T], error) {
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(msg), nil
}

func (f *fakeAPI) CreateSpace(_ context.Context, r *connect.Request[torporv1.CreateSpaceRequest]) (*connect.Response[torporv1.Space], error) {
	return respond(f.spaces.create(r.Msg.GetSpace()))
}

func (f *fakeAPI) GetSpace(_ context.Context, r *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Space], error) {
	return respond(f.spaces.get(r.Msg.GetSpace(), r.Msg.GetName()))
}

func (f *fakeAPI) ListSpaces(_ context.Context, r *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListSpacesResponse], error) {
	items, next := f.spaces.list(r.Msg)
	return connect.NewResponse(&torporv1.ListSpacesResponse{Spaces: items, NextPageToken: next}), nil
}

func (f *fakeAPI) UpdateSpace(_ context.Context, r *connect.Request[torporv1.UpdateSpaceRequest]) (*connect.Response[torporv1.Space], error) {
	in := r.Msg.GetSpace()
	return respond(f.spaces.update("", in.GetMetadata().GetName(), func(s *torporv1.Space) error {
		s.Spec = in.GetSpec()
		return nil
	}))
}

func (f *fakeAPI) DeleteSpace(_ context.Context, r *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	return respond(f.spaces.remove(r.Msg))
}

// CreateTemplate applies like the server: an identical spec is returned
// unchanged, a different one becomes the next revision. The fake keeps only
// the latest revision of each name.
func (f *fakeAPI) CreateTemplate(_ context.Context, r *connect.Request[torporv1.CreateTemplateRequest]) (*connect.Response[torporv1.Template], error) {
	t := r.Msg.GetTemplate()
	m := t.GetMetadata()
	existing, err := f.templates.get(m.GetSpace(), m.GetName())
	if err != nil {
		t.Status = &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING, Revision: 1, LatestRevision: 1}
		return respond(f.templates.create(t))
	}
	if proto.Equal(existing.GetSpec(), t.GetSpec()) {
		return connect.NewResponse(existing), nil
	}
	return respond(f.templates.update(m.GetSpace(), m.GetName(), func(cur *torporv1.Template) error {
		rev := cur.GetStatus().GetRevision() + 1
		cur.Spec = t.GetSpec()
		cur.Status = &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING, Revision: rev, LatestRevision: rev}
		return nil
	}))
}

// GetTemplate serves "NAME" and "NAME@REV" of the latest revision.
func (f *fakeAPI) GetTemplate(_ context.Context, r *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Template], error) {
	name, rev, err := validate.TemplateRef("name", r.Msg.GetName())
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	t, err := f.templates.get(r.Msg.GetSpace(), name)
	if err == nil && rev != 0 && rev != t.GetStatus().GetRevision() {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("template %s/%s not found", r.Msg.GetSpace(), r.Msg.GetName()))
	}
	return respond(t, err)
}

func (f *fakeAPI) ListTemplates(_ context.Context, r *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListTemplatesResponse], error) {
	items, next := f.templates.list(r.Msg)
	return connect.NewResponse(&torporv1.ListTemplatesResponse{Templates: items, NextPageToken: next}), nil
}

func (f *fakeAPI) DeleteTemplate(_ context.Context, r *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	return respond(f.templates.remove(r.Msg))
}

func (f *fakeAPI) CreateActor(_ context.Context, r *connect.Request[torporv1.CreateActorRequest]) (*connect.Response[torporv1.Actor], error) {
	a := r.Msg.GetActor()
	t, err := f.templates.get(a.GetMetadata().GetSpace(), a.GetSpec().GetTemplate())
	if err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("spec.template: %w", err))
	}
	a.Spec.TemplateRevision = t.GetStatus().GetRevision()
	a.Status = &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED}
	return respond(f.actors.create(a))
}

func (f *fakeAPI) GetActor(_ context.Context, r *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error) {
	return respond(f.actors.get(r.Msg.GetSpace(), r.Msg.GetName()))
}

func (f *fakeAPI) ListActors(_ context.Context, r *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListActorsResponse], error) {
	items, next := f.actors.list(r.Msg)
	return connect.NewResponse(&torporv1.ListActorsResponse{Actors: items, NextPageToken: next}), nil
}

func (f *fakeAPI) UpdateActor(_ context.Context, r *connect.Request[torporv1.UpdateActorRequest]) (*connect.Response[torporv1.Actor], error) {
	f.mu.Lock()
	f.updates = append(f.updates, r.Msg)
	f.mu.Unlock()
	meta, spec := r.Msg.GetActor().GetMetadata(), r.Msg.GetActor().GetSpec()
	return respond(f.actors.update(meta.GetSpace(), meta.GetName(), func(a *torporv1.Actor) error {
		for _, p := range r.Msg.GetUpdateMask().GetPaths() {
			switch p {
			case "spec.worker_selector":
				a.Spec.WorkerSelector = spec.GetWorkerSelector()
			case "spec.template":
				a.Spec.Template = spec.GetTemplate()
			default:
				return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%q cannot be updated", p))
			}
		}
		a.Metadata.Version++
		return nil
	}))
}

func (f *fakeAPI) DeleteActor(_ context.Context, r *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	return respond(f.actors.remove(r.Msg))
}

func (f *fakeAPI) ResumeActor(_ context.Context, r *connect.Request[torporv1.ResumeActorRequest]) (*connect.Response[torporv1.Actor], error) {
	f.mu.Lock()
	f.resumes = append(f.resumes, r.Msg)
	refuse := f.noFreeWorker > 0
	if refuse {
		f.noFreeWorker--
	}
	f.mu.Unlock()
	if refuse {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("no free worker for actor %s/%s", r.Msg.GetSpace(), r.Msg.GetName()))
	}
	return f.setState(r.Msg.GetSpace(), r.Msg.GetName(), torporv1.ActorState_ACTOR_STATE_RUNNING)
}

func (f *fakeAPI) SuspendActor(_ context.Context, r *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error) {
	return f.setState(r.Msg.GetSpace(), r.Msg.GetName(), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
}

func (f *fakeAPI) PauseActor(_ context.Context, r *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error) {
	return f.setState(r.Msg.GetSpace(), r.Msg.GetName(), torporv1.ActorState_ACTOR_STATE_PAUSED)
}

func (f *fakeAPI) setState(space, name string, state torporv1.ActorState) (*connect.Response[torporv1.Actor], error) {
	return respond(f.actors.update(space, name, func(a *torporv1.Actor) error {
		a.Status.State = state
		return nil
	}))
}

func (f *fakeAPI) ListActorEvents(_ context.Context, r *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.ListActorEventsResponse], error) {
	if _, err := f.actors.get(r.Msg.GetSpace(), r.Msg.GetName()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return connect.NewResponse(&torporv1.ListActorEventsResponse{Events: f.events}), nil
}

func (f *fakeAPI) CreateWorker(_ context.Context, r *connect.Request[torporv1.CreateWorkerRequest]) (*connect.Response[torporv1.Worker], error) {
	return respond(f.workers.create(r.Msg.GetWorker()))
}

func (f *fakeAPI) GetWorker(_ context.Context, r *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Worker], error) {
	return respond(f.workers.get(r.Msg.GetSpace(), r.Msg.GetName()))
}

func (f *fakeAPI) ListWorkers(_ context.Context, r *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListWorkersResponse], error) {
	items, next := f.workers.list(r.Msg)
	return connect.NewResponse(&torporv1.ListWorkersResponse{Workers: items, NextPageToken: next}), nil
}

func (f *fakeAPI) DeleteWorker(_ context.Context, r *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	return respond(f.workers.remove(r.Msg))
}

func (f *fakeAPI) GetSnapshot(_ context.Context, r *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Snapshot], error) {
	return respond(f.snapshots.get(r.Msg.GetSpace(), r.Msg.GetName()))
}

func (f *fakeAPI) ListSnapshots(_ context.Context, r *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListSnapshotsResponse], error) {
	items, next := f.snapshots.list(r.Msg)
	return connect.NewResponse(&torporv1.ListSnapshotsResponse{Snapshots: items, NextPageToken: next}), nil
}

func (f *fakeAPI) DeleteSnapshot(_ context.Context, r *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	return respond(f.snapshots.remove(r.Msg))
}
