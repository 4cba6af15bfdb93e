package store_test

import (
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// TestPostgresPipelinedTransaction: on PostgreSQL, BEGIN travels with a
// transaction's first statement and an event with the COMMIT, so an
// update and an event cost two round trips; and an event that fails at
// the commit still fails the whole transaction.
func TestPostgresPipelinedTransaction(t *testing.T) {
	ctx := testContext(t)
	url, trips := storetest.RoundTrips(t, storetest.URL(t, "postgres"))
	s := openStore(t, ctx, url)
	a, err := s.Actors().Create(ctx, newActor("default", "a"))
	if err != nil {
		t.Fatal(err)
	}
	step := func() error {
		return s.InTx(ctx, func(tx store.Tx) error {
			a.Status.State = torporv1.ActorState_ACTOR_STATE_RESUMING
			next, err := tx.Actors().Update(ctx, a)
			if err != nil {
				return err
			}
			a = next
			return tx.AppendEvent(ctx, store.Event{ActorUID: a.GetMetadata().GetUid(), Reason: "step"})
		})
	}
	// The first runs prepare the statements on the connection (the
	// second updates fewer columns: another statement).
	for range 2 {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	before := trips.Load()
	for range 3 {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if got := trips.Load() - before; got != 3*2 {
		t.Errorf("3 transactions of an update and an event took %d round trips, want 6", got)
	}
	events, err := s.Events(ctx, a.GetMetadata().GetUid(), 0)
	if err != nil || len(events) != 5 {
		t.Fatalf("events after five steps: %v, %v; want 5", events, err)
	}

	// A deferred statement that fails at the commit: a reason with a NUL
	// byte, which PostgreSQL's text refuses.
	version := a.GetMetadata().GetVersion()
	err = s.InTx(ctx, func(tx store.Tx) error {
		a.Status.State = torporv1.ActorState_ACTOR_STATE_RUNNING
		if _, err := tx.Actors().Update(ctx, a); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{ActorUID: a.GetMetadata().GetUid(), Reason: "bad\x00reason"})
	})
	if err == nil {
		t.Fatal("a transaction whose event failed at the commit succeeded")
	}
	got, err := s.Actors().Get(ctx, "default", "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.GetMetadata().GetVersion() != version {
		t.Errorf("actor version %d after a failed transaction, want %d (its update rolled back)", got.GetMetadata().GetVersion(), version)
	}
	// The connection went back to the pool clean: the store still works.
	if err := step(); err != nil {
		t.Fatalf("a transaction after the failed one: %v", err)
	}
}
