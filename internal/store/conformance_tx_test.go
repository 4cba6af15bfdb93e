package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

func testTxCommit(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	err := s.InTx(ctx, func(tx store.Tx) error {
		if _, err := tx.Actors().Create(ctx, newActor("default", "web")); err != nil {
			return err
		}
		w, err := tx.Workers().Create(ctx, newWorker("torpor", "slot-0", "node-1", "default"))
		if err != nil {
			return err
		}
		// The transaction reads its own writes.
		a, err := tx.Actors().Get(ctx, "default", "web")
		if err != nil {
			return err
		}
		return claim(ctx, tx, a, w)
	})
	if err != nil {
		t.Fatal(err)
	}
	a := mustGet(t, ctx, s.Actors(), "default", "web")
	w := mustGet(t, ctx, s.Workers(), "torpor", "slot-0")
	if a.GetStatus().GetWorker().GetUid() != w.GetMetadata().GetUid() || w.GetStatus().GetActor().GetUid() != a.GetMetadata().GetUid() {
		t.Fatalf("actor and worker do not point at each other:\n actor  %v\n worker %v", a, w)
	}
}

func testTxRollbackOnError(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	before := mustCreate(t, ctx, s.Actors(), newActor("default", "existing"))
	errBoom := errors.New("boom")
	err := s.InTx(ctx, func(tx store.Tx) error {
		if _, err := tx.Actors().Create(ctx, newActor("default", "web")); err != nil {
			return err
		}
		a := proto.CloneOf(before)
		a.Status.State = torporv1.ActorState_ACTOR_STATE_CRASHED
		if _, err := tx.Actors().Update(ctx, a); err != nil {
			return err
		}
		if err := tx.AppendEvent(ctx, store.Event{ActorUID: before.GetMetadata().GetUid(), Reason: "crash"}); err != nil {
			return err
		}
		return errBoom
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("InTx = %v, want fn's error", err)
	}
	_, err = s.Actors().Get(ctx, "default", "web")
	wantErr(t, err, store.ErrNotFound)
	wantEqual(t, "updated record after rollback", mustGet(t, ctx, s.Actors(), "default", "existing"), before)
	if evs, err := s.Events(ctx, before.GetMetadata().GetUid(), 0); err != nil || len(evs) != 0 {
		t.Fatalf("events after rollback = %v, %v; want none", evs, err)
	}
}

func testTxRollbackOnPanic(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic of fn", r)
			}
		}()
		_ = s.InTx(ctx, func(tx store.Tx) error {
			if _, err := tx.Actors().Create(ctx, newActor("default", "web")); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	_, err := s.Actors().Get(ctx, "default", "web")
	wantErr(t, err, store.ErrNotFound)
	// The transaction's connection was released: writes still go through.
	writeCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := s.Actors().Create(writeCtx, newActor("default", "after")); err != nil {
		t.Fatalf("write after a panicking transaction: %v", err)
	}
}

func testTxStaleWrite(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	a := mustCreate(t, ctx, s.Actors(), newActor("default", "web"))
	stale := mustCreate(t, ctx, s.Workers(), newWorker("torpor", "slot-0", "node-1", "default"))
	// Someone else changes the worker after it was read.
	bumped := proto.CloneOf(stale)
	bumped.Spec.Ip = "10.0.0.9"
	if _, err := s.Workers().Update(ctx, bumped); err != nil {
		t.Fatal(err)
	}
	err := s.InTx(ctx, func(tx store.Tx) error {
		// claim writes the worker first; write the actor first here so the
		// rollback has something to undo.
		resuming := proto.CloneOf(a)
		resuming.Status.State = torporv1.ActorState_ACTOR_STATE_RESUMING
		if _, err := tx.Actors().Update(ctx, resuming); err != nil {
			return err
		}
		w := proto.CloneOf(stale)
		w.Status.Actor = &torporv1.ActorRef{Space: "default", Name: "web", Uid: a.GetMetadata().GetUid()}
		_, err := tx.Workers().Update(ctx, w)
		return err
	})
	wantErr(t, err, store.ErrConflict, "worker torpor/slot-0")
	wantEqual(t, "actor after the rolled back claim", mustGet(t, ctx, s.Actors(), "default", "web"), a)
}

// testConcurrentClaim pins DESIGN invariant 1: actors racing for one free
// worker in concurrent transactions; exactly one gets it, and actor and
// worker point at each other. The worker is read either inside each
// transaction or once before all of them (as a scheduler that picked it
// from a list would), which makes every claimer race with the same version.
func testConcurrentClaim(t *testing.T, b backend) {
	for _, variant := range []struct {
		name       string
		readInside bool
	}{{"worker read in the transaction", true}, {"worker read before the transactions", false}} {
		readInside := variant.readInside
		t.Run(variant.name, func(t *testing.T) {
			ctx, s := fresh(t, b)
			const claimers = 8
			picked := mustCreate(t, ctx, s.Workers(), newWorker("torpor", "slot-0", "node-1", "default"))
			for i := range claimers {
				mustCreate(t, ctx, s.Actors(), newActor("default", fmt.Sprintf("a%d", i)))
			}
			start := make(chan struct{})
			errs := make([]error, claimers)
			var wg sync.WaitGroup
			for i := range claimers {
				wg.Go(func() {
					<-start
					errs[i] = s.InTx(ctx, func(tx store.Tx) error {
						w := picked
						if readInside {
							var err error
							if w, err = tx.Workers().Get(ctx, "torpor", "slot-0"); err != nil {
								return err
							}
						}
						a, err := tx.Actors().Get(ctx, "default", fmt.Sprintf("a%d", i))
						if err != nil {
							return err
						}
						return claim(ctx, tx, a, w)
					})
				})
			}
			close(start)
			wg.Wait()
			checkOneClaim(t, ctx, s, errs)
		})
	}
}

func checkOneClaim(t *testing.T, ctx context.Context, s store.Store, errs []error) {
	t.Helper()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("claimers a%d and a%d both got the worker", winner, i)
			}
			winner = i
		case errors.Is(err, errWorkerBusy), errors.Is(err, store.ErrConflict):
		default:
			t.Errorf("claimer a%d: %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatalf("no claimer got the free worker: %v", errs)
	}
	w := mustGet(t, ctx, s.Workers(), "torpor", "slot-0")
	for i := range errs {
		a := mustGet(t, ctx, s.Actors(), "default", fmt.Sprintf("a%d", i))
		hasWorker := a.GetStatus().GetWorker().GetUid() == w.GetMetadata().GetUid()
		isWorkers := w.GetStatus().GetActor().GetUid() == a.GetMetadata().GetUid()
		if want := i == winner; hasWorker != want || isWorkers != want {
			t.Errorf("a%d (winner a%d): actor holds worker %v, worker holds actor %v", i, winner, hasWorker, isWorkers)
		}
	}
}
