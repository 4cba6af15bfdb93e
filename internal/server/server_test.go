package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
)

const pinnedImage = "oci:/images/counter@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

type clients struct {
	spaces    torporv1connect.SpaceServiceClient
	templates torporv1connect.TemplateServiceClient
	actors    torporv1connect.ActorServiceClient
	workers   torporv1connect.WorkerServiceClient
	snapshots torporv1connect.SnapshotServiceClient
}

// startServer serves the API over a SQLite store in dbPath over TLS, with
// clients holding the admin token.
func startServer(t *testing.T, dbPath string) clients {
	t.Helper()
	r := startReplica(t, "sqlite:"+dbPath, io.Discard)
	return r.clients(r.admin(t))
}

// clients are the API's clients over hc.
func (r *replica) clients(hc *http.Client) clients {
	return clients{
		spaces:    torporv1connect.NewSpaceServiceClient(hc, r.url),
		templates: torporv1connect.NewTemplateServiceClient(hc, r.url),
		actors:    torporv1connect.NewActorServiceClient(hc, r.url),
		workers:   torporv1connect.NewWorkerServiceClient(hc, r.url),
		snapshots: torporv1connect.NewSnapshotServiceClient(hc, r.url),
	}
}

func counterTemplate(name string) *torporv1.Template {
	return &torporv1.Template{
		Metadata: &torporv1.ObjectMeta{Name: name, Space: "default"},
		Spec: &torporv1.TemplateSpec{
			Containers: []*torporv1.Container{{
				Name:           "counter",
				Image:          pinnedImage,
				ReadinessProbe: &torporv1.Probe{HttpGet: &torporv1.HTTPGetAction{Path: "/readyz", Port: 8080}},
				Mounts:         []*torporv1.Mount{{Volume: "data", Path: "/data"}},
			}},
			Volumes: []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
		},
	}
}

func wantCode(t *testing.T, err error, code connect.Code, msgPart string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want %v error containing %q, got success", code, msgPart)
	}
	if got := connect.CodeOf(err); got != code {
		t.Fatalf("want code %v, got %v (%v)", code, got, err)
	}
	if !strings.Contains(err.Error(), msgPart) {
		t.Fatalf("error %q does not mention %q", err, msgPart)
	}
}

func TestTemplateValidation(t *testing.T) {
	c := startServer(t, filepath.Join(t.TempDir(), "t.db"))
	ctx := context.Background()
	tests := []struct {
		name   string
		mutate func(*torporv1.Template)
		field  string
	}{
		{"bad name", func(tp *torporv1.Template) { tp.Metadata.Name = "Not_A_Label" }, "metadata.name"},
		{"unknown space", func(tp *torporv1.Template) { tp.Metadata.Space = "nope" }, `space "nope" does not exist`},
		{"tag not pinned", func(tp *torporv1.Template) { tp.Spec.Containers[0].Image = "docker.io/library/busybox:latest" }, "spec.containers[0].image"},
		{"onCommit wider than onPause", func(tp *torporv1.Template) {
			tp.Spec.SnapshotPolicy = &torporv1.SnapshotPolicy{OnPause: torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA, OnCommit: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL}
		}, "spec.snapshotPolicy.onCommit"},
		{"duplicate volume", func(tp *torporv1.Template) {
			tp.Spec.Volumes = append(tp.Spec.Volumes, &torporv1.Volume{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE})
		}, "spec.volumes[1].name"},
		{"duplicate container", func(tp *torporv1.Template) {
			tp.Spec.Containers = append(tp.Spec.Containers, &torporv1.Container{Name: "counter", Image: pinnedImage})
		}, "spec.containers[1].name"},
		{"mount of undeclared volume", func(tp *torporv1.Template) { tp.Spec.Containers[0].Mounts[0].Volume = "other" }, "spec.containers[0].mounts[0].volume"},
		{"volume nobody mounts", func(tp *torporv1.Template) {
			tp.Spec.Volumes = append(tp.Spec.Volumes, &torporv1.Volume{Name: "spare", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE})
		}, "spec.volumes[1]"},
		{"probe port", func(tp *torporv1.Template) { tp.Spec.Containers[0].ReadinessProbe.HttpGet.Port = 70000 }, "readinessProbe.httpGet.port"},
		{"relative mount path", func(tp *torporv1.Template) { tp.Spec.Containers[0].Mounts[0].Path = "data" }, "spec.containers[0].mounts[0].path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := counterTemplate("counter")
			tt.mutate(tp)
			_, err := c.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tp}))
			code := connect.CodeInvalidArgument
			if strings.Contains(tt.field, "does not exist") {
				code = connect.CodeFailedPrecondition
			}
			wantCode(t, err, code, tt.field)
			list, err := c.templates.ListTemplates(ctx, connect.NewRequest(&torporv1.ListRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			if n := len(list.Msg.GetTemplates()); n != 0 {
				t.Fatalf("a refused template was written: %d templates stored", n)
			}
		})
	}
}

func TestActorLifecycleRecords(t *testing.T) {
	db := filepath.Join(t.TempDir(), "t.db")
	c := startServer(t, db)
	ctx := context.Background()

	_, err := c.actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Name: "c1", Space: "default"}, Spec: &torporv1.ActorSpec{Template: "counter"},
	}}))
	wantCode(t, err, connect.CodeFailedPrecondition, "spec.template")

	if _, err := c.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: counterTemplate("counter")})); err != nil {
		t.Fatal(err)
	}
	created, err := c.actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Name: "c1", Space: "default"}, Spec: &torporv1.ActorSpec{Template: "counter"},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	if st := created.Msg.GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("new actor state = %v, want SUSPENDED", st)
	}
	m := created.Msg.GetMetadata()
	if m.GetUid() == "" || m.GetVersion() != 1 || m.GetCreateTime() == nil || m.GetUpdateTime() == nil {
		t.Fatalf("metadata incomplete: %v", m)
	}

	update := func(version int64, paths ...string) (*connect.Response[torporv1.Actor], error) {
		return c.actors.UpdateActor(ctx, connect.NewRequest(&torporv1.UpdateActorRequest{
			Actor: &torporv1.Actor{
				Metadata: &torporv1.ObjectMeta{Name: "c1", Space: "default", Version: version},
				Spec:     &torporv1.ActorSpec{WorkerSelector: map[string]string{"tier": "gold"}},
			},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: paths},
		}))
	}
	updated, err := update(0, "spec.worker_selector")
	if err != nil {
		t.Fatal(err)
	}
	if updated.Msg.GetMetadata().GetVersion() != 2 || updated.Msg.GetSpec().GetWorkerSelector()["tier"] != "gold" {
		t.Fatalf("update not applied: %v", updated.Msg)
	}
	_, err = update(1, "spec.worker_selector")
	wantCode(t, err, connect.CodeAborted, "version")
	_, err = update(0, "status.state")
	wantCode(t, err, connect.CodeInvalidArgument, "updateMask")

	// Everything survives a restart of the server on the same database.
	c2 := startServer(t, db)
	got, err := c2.actors.GetActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "c1"}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Msg.GetMetadata().GetVersion() != 2 || got.Msg.GetSpec().GetWorkerSelector()["tier"] != "gold" {
		t.Fatalf("after restart: %v", got.Msg)
	}

	if _, err := c2.actors.DeleteActor(ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: "default", Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	_, err = c2.actors.GetActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "c1"}))
	wantCode(t, err, connect.CodeNotFound, "c1")
}

func TestListPaging(t *testing.T) {
	c := startServer(t, filepath.Join(t.TempDir(), "t.db"))
	ctx := context.Background()
	if _, err := c.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: counterTemplate("counter")})); err != nil {
		t.Fatal(err)
	}
	const n = 7
	for i := range n {
		name := string(rune('a'+i)) + "-actor"
		if _, err := c.actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
			Metadata: &torporv1.ObjectMeta{Name: name, Space: "default"}, Spec: &torporv1.ActorSpec{Template: "counter"},
		}})); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	token := ""
	for pages := 0; ; pages++ {
		if pages > n {
			t.Fatal("paging does not end")
		}
		resp, err := c.actors.ListActors(ctx, connect.NewRequest(&torporv1.ListRequest{Space: "default", PageSize: 3, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range resp.Msg.GetActors() {
			names = append(names, a.GetMetadata().GetName())
		}
		if token = resp.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	if len(names) != n || names[0] != "a-actor" || names[n-1] != "g-actor" {
		t.Fatalf("paged list = %v", names)
	}
}

func TestSpacesAndWorkers(t *testing.T) {
	c := startServer(t, filepath.Join(t.TempDir(), "t.db"))
	ctx := context.Background()
	if _, err := c.spaces.GetSpace(ctx, connect.NewRequest(&torporv1.GetRequest{Name: "default"})); err != nil {
		t.Fatalf("default space: %v", err)
	}
	_, err := c.spaces.CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: "default"}}}))
	wantCode(t, err, connect.CodeAlreadyExists, "default")
	_, err = c.spaces.DeleteSpace(ctx, connect.NewRequest(&torporv1.DeleteRequest{Name: "ghost"}))
	wantCode(t, err, connect.CodeNotFound, "ghost")

	w := &torporv1.Worker{
		Metadata: &torporv1.ObjectMeta{Name: "w0", Space: "torpor-system", Labels: map[string]string{"tier": "gold"}},
		Spec:     &torporv1.WorkerSpec{Node: "n1", Ip: "10.213.0.2", Pool: "default", SandboxClass: "gvisor"},
	}
	if _, err := c.workers.CreateWorker(ctx, connect.NewRequest(&torporv1.CreateWorkerRequest{Worker: w})); err != nil {
		t.Fatal(err)
	}
	// The pool is an attribute, not part of the key: a second worker of the
	// same name in another pool is the same worker.
	w.Spec.Pool = "other"
	_, err = c.workers.CreateWorker(ctx, connect.NewRequest(&torporv1.CreateWorkerRequest{Worker: w}))
	wantCode(t, err, connect.CodeAlreadyExists, "w0")
	w.Spec.Ip = ""
	w.Metadata.Name = "w1"
	_, err = c.workers.CreateWorker(ctx, connect.NewRequest(&torporv1.CreateWorkerRequest{Worker: w}))
	wantCode(t, err, connect.CodeInvalidArgument, "spec.ip")
}

func TestOversizedRequestRefused(t *testing.T) {
	c := startServer(t, filepath.Join(t.TempDir(), "t.db"))
	tp := counterTemplate("big")
	tp.Spec.Containers[0].Args = []string{strings.Repeat("x", maxRequestBytes+1)}
	_, err := c.templates.CreateTemplate(context.Background(), connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tp}))
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("oversized request accepted: %v", err)
	}
	if code := connect.CodeOf(err); code != connect.CodeResourceExhausted {
		t.Fatalf("code = %v, want ResourceExhausted (%v)", code, err)
	}
}

func TestBadPageTokenIsInvalidArgument(t *testing.T) {
	c := startServer(t, filepath.Join(t.TempDir(), "t.db"))
	_, err := c.actors.ListActors(context.Background(), connect.NewRequest(&torporv1.ListRequest{Space: "default", PageToken: "not-a-token"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("bad page token: %v, want InvalidArgument", err)
	}
}
