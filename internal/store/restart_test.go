package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// bump is a read-modify-write of one actor's labels in a transaction, the
// shape of every engine step: it reads inside the transaction, so a second
// run starts from what is stored.
func bump(ctx context.Context, tx store.Tx, name string, during func()) error {
	a, err := tx.Actors().Get(ctx, "default", name)
	if err != nil {
		return err
	}
	if during != nil {
		during()
	}
	if a.Metadata.Labels == nil {
		a.Metadata.Labels = map[string]string{}
	}
	a.Metadata.Labels["bumped"] = "yes"
	if _, err := tx.Actors().Update(ctx, a); err != nil {
		return err
	}
	return tx.AppendEvent(ctx, store.Event{ActorUID: a.GetMetadata().GetUid(), Reason: "bumped"})
}

// TestTransactionRidesOutPostgresRestart: a PostgreSQL restart in the
// middle of a transaction costs the transaction a second run, not an
// error; and a store call after the restart, on a pool of dead
// connections, succeeds too.
func TestTransactionRidesOutPostgresRestart(t *testing.T) {
	pg := storetest.StartPostgres(t)
	ctx := testContext(t)
	st := openStore(t, ctx, pg.URL())
	created := mustCreate(t, ctx, st.Actors(), newActor("default", "a"))

	runs := 0
	err := st.InTx(ctx, func(tx store.Tx) error {
		runs++
		return bump(ctx, tx, "a", func() {
			if runs == 1 {
				pg.Restart(t)
			}
		})
	})
	if err != nil {
		t.Fatalf("transaction across a restart: %v", err)
	}
	if runs < 2 {
		t.Fatalf("the transaction ran %d time(s): the restart did not interrupt it", runs)
	}
	got := mustGet(t, ctx, st.Actors(), "default", "a")
	if got.GetMetadata().GetLabels()["bumped"] != "yes" || got.GetMetadata().GetVersion() != created.GetMetadata().GetVersion()+1 {
		t.Fatalf("after the restart the actor is %v, want one update over version %d", got.GetMetadata(), created.GetMetadata().GetVersion())
	}

	pg.Restart(t)
	if _, err := st.Actors().Get(ctx, "default", "a"); err != nil {
		t.Fatalf("get after a restart: %v", err)
	}
	pg.Restart(t)
	if _, _, err := st.Actors().List(ctx, store.ListOptions{}); err != nil {
		t.Fatalf("list after a restart: %v", err)
	}
}

// TestTransactionWaitsForPostgres: a transaction that meets a stopped
// server keeps trying, through refused connections, until it is back.
func TestTransactionWaitsForPostgres(t *testing.T) {
	pg := storetest.StartPostgres(t)
	ctx := testContext(t)
	st := openStore(t, ctx, pg.URL())
	mustCreate(t, ctx, st.Actors(), newActor("default", "a"))

	stopped, resume := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		first := true
		done <- st.InTx(ctx, func(tx store.Tx) error {
			return bump(ctx, tx, "a", func() {
				if first {
					first = false
					close(stopped)
					<-resume
				}
			})
		})
	}()
	<-stopped
	pg.Stop(t)
	close(resume)
	// Down for a while, so that the transaction's retries meet refused
	// connections rather than only a broken one.
	time.Sleep(time.Second)
	pg.Start(t)
	if err := <-done; err != nil {
		t.Fatalf("transaction across a stop: %v", err)
	}
	if got := mustGet(t, ctx, st.Actors(), "default", "a"); got.GetMetadata().GetLabels()["bumped"] != "yes" {
		t.Fatalf("the transaction's write is missing: %v", got.GetMetadata())
	}
}

// TestPostgresDownPastBudget: a server down for longer than the retry
// budget answers ErrUnavailable, naming the operation, for transactions
// and single calls alike; errors of substance keep their own kind.
func TestPostgresDownPastBudget(t *testing.T) {
	pg := storetest.StartPostgres(t)
	ctx := testContext(t)
	st := openStore(t, ctx, pg.URL())
	mustCreate(t, ctx, st.Actors(), newActor("default", "a"))
	if _, err := st.Actors().Get(ctx, "default", "missing"); !errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("get of a missing actor: %v, want only ErrNotFound", err)
	}

	store.SetRetryBudget(t, 300*time.Millisecond)
	pg.Stop(t)
	err := st.InTx(ctx, func(tx store.Tx) error { return bump(ctx, tx, "a", nil) })
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("transaction while the server is down: %v, want ErrUnavailable", err)
	}
	_, err = st.Actors().Get(ctx, "default", "a")
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("get while the server is down: %v, want ErrUnavailable", err)
	}
	if want := "actor default/a"; !strings.Contains(err.Error(), want) {
		t.Fatalf("get while the server is down: %q does not name %q", err, want)
	}
	if _, err := st.GetSecret(ctx, "s"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("get secret while the server is down: %v, want ErrUnavailable", err)
	}

	pg.Start(t)
	if _, err := st.Actors().Get(ctx, "default", "a"); err != nil {
		t.Fatalf("get once the server is back: %v", err)
	}
}
