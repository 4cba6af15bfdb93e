package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// backend makes fresh, empty stores of one kind for tests and benchmarks.
type backend struct {
	name string
}

// freshURL names a new, empty store that is removed when tb ends.
func (b backend) freshURL(tb testing.TB) string { return storetest.URL(tb, b.name) }

var backends = []backend{{name: "sqlite"}, {name: "postgres"}}

// openStore opens url and closes the store when tb ends.
func openStore(tb testing.TB, ctx context.Context, url string) store.Store {
	tb.Helper()
	s, err := store.Open(ctx, url)
	if err != nil {
		tb.Fatalf("open %s: %v", url, err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("close store: %v", err)
		}
	})
	return s
}

// testContext bounds a test so that a lost wakeup fails it instead of
// hanging the suite.
func testContext(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

func meta(space, name string) *torporv1.ObjectMeta {
	return &torporv1.ObjectMeta{Space: space, Name: name}
}

func newActor(space, name string) *torporv1.Actor {
	return &torporv1.Actor{
		Metadata: meta(space, name),
		Spec:     &torporv1.ActorSpec{Template: "base", TemplateRevision: 1},
		Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED},
	}
}

func newWorker(namespace, name, node, pool string) *torporv1.Worker {
	return &torporv1.Worker{
		Metadata: meta(namespace, name),
		Spec:     &torporv1.WorkerSpec{Node: node, Pool: pool, Ip: "10.0.0.2", SandboxClass: "gvisor"},
		Status:   &torporv1.WorkerStatus{},
	}
}

var errWorkerBusy = errors.New("worker already hosts an actor")

// claim points actor and worker at each other (DESIGN invariant 1); the
// caller runs it inside one transaction.
func claim(ctx context.Context, tx store.Tx, a *torporv1.Actor, w *torporv1.Worker) error {
	if w.GetStatus().GetActor().GetUid() != "" {
		return errWorkerBusy
	}
	w = proto.CloneOf(w)
	am := a.GetMetadata()
	w.Status = &torporv1.WorkerStatus{Actor: &torporv1.ActorRef{Space: am.GetSpace(), Name: am.GetName(), Uid: am.GetUid()}}
	w, err := tx.Workers().Update(ctx, w)
	if err != nil {
		return err
	}
	a = proto.CloneOf(a)
	wm := w.GetMetadata()
	a.Status.State = torporv1.ActorState_ACTOR_STATE_RESUMING
	a.Status.Worker = &torporv1.WorkerRef{Namespace: wm.GetSpace(), Name: wm.GetName(), Uid: wm.GetUid(), Node: w.GetSpec().GetNode(), Ip: w.GetSpec().GetIp()}
	_, err = tx.Actors().Update(ctx, a)
	return err
}
