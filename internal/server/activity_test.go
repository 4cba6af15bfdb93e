package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/validate"
)

// TestActivityReportsAndWorkerIdle: activity reports are for routers
// (and the admin), never a user's token; what they say shows in the
// worker list as the idle time of the worker's actor, and the workers
// metric counts workers by pool and state.
func TestActivityReportsAndWorkerIdle(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, storetest.URL(t, "sqlite"), io.Discard)
	// A RUNNING actor on w-1, placed by hand (invariant 1 both ways), and
	// a free worker kept warm.
	started := time.Now().Add(-time.Hour)
	a, err := r.store.Actors().Create(ctx, &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "a1"},
		Spec:     &torporv1.ActorSpec{Template: "t", TemplateRevision: 1},
		Status: &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_RUNNING, StateTime: timestamppb.New(started),
			Worker: &torporv1.WorkerRef{Namespace: validate.WorkerNamespace, Name: "w-1", Uid: "wuid-1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*torporv1.Worker{
		{Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: "w-1", Uid: "wuid-1"}, Spec: &torporv1.WorkerSpec{Pool: "p"},
			Status: &torporv1.WorkerStatus{Actor: &torporv1.ActorRef{Space: "default", Name: "a1", Uid: a.GetMetadata().GetUid()}}},
		{Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: "w-2"}, Spec: &torporv1.WorkerSpec{Pool: "p"},
			Status: &torporv1.WorkerStatus{WarmActorUid: "someone"}},
	} {
		if _, err := r.store.Workers().Create(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	report := &torporv1.ReportActivityRequest{Reporter: "edge", Actors: []*torporv1.ActorActivity{
		{Space: "default", Name: "a1", LastActive: timestamppb.New(time.Now().Add(-90 * time.Second)), InFlight: 0},
	}}
	user := torporv1connect.NewActorServiceClient(testClient(t, r.roots, nil, r.apiToken(t, "default")), r.url)
	_, err = user.ReportActivity(ctx, connect.NewRequest(report))
	wantCode(t, err, connect.CodePermissionDenied, "only a router")
	admin := r.clients(r.admin(t))
	if _, err := admin.actors.ReportActivity(ctx, connect.NewRequest(&torporv1.ReportActivityRequest{Actors: report.Actors})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a report without a reporter: %v, want InvalidArgument", err)
	}
	if _, err := torporv1connect.NewActorServiceClient(r.admin(t), r.url).ReportActivity(ctx, connect.NewRequest(report)); err != nil {
		t.Fatalf("report: %v", err)
	}
	list, err := admin.workers.ListWorkers(ctx, connect.NewRequest(&torporv1.ListRequest{Space: validate.WorkerNamespace}))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*torporv1.Worker{}
	for _, w := range list.Msg.GetWorkers() {
		byName[w.GetMetadata().GetName()] = w
	}
	idle := time.Since(byName["w-1"].GetStatus().GetActorLastActive().AsTime())
	if idle < 89*time.Second || idle > time.Hour-time.Minute {
		t.Errorf("w-1's actor idle for %s, want the reported 90s (not since it became RUNNING an hour ago)", idle)
	}
	if byName["w-2"].GetStatus().GetActorLastActive() != nil {
		t.Errorf("the free worker has an actor activity: %v", byName["w-2"].GetStatus())
	}
	// Never stored: the worker record itself has none.
	stored, err := r.store.Workers().Get(ctx, validate.WorkerNamespace, "w-1")
	if err != nil || stored.GetStatus().GetActorLastActive() != nil {
		t.Errorf("stored worker: %v, %v; want no activity in it", stored.GetStatus(), err)
	}

	resp, err := r.admin(t).Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: %s", resp.Status)
	}
	for _, want := range []string{`torpor_workers{pool="p",state="busy"} 1`, `torpor_workers{pool="p",state="warm"} 1`, `torpor_workers{pool="p",state="free"} 0`} {
		if !strings.Contains(string(page), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
