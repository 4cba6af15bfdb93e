package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// openBatching opens a SQLite store and counts its commits.
func openBatching(t *testing.T) (*sqlStore, *atomic.Int64) {
	t.Helper()
	st, err := Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s := st.(*sqlStore)
	var commits atomic.Int64
	wrote := s.batch.committed
	s.batch.committed = func() { commits.Add(1); wrote() }
	return s, &commits
}

func space(name string) *torporv1.Space {
	return &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: name}}
}

// joined runs first as a transaction that starts others and waits,
// inside, until they all wait for their turn: so all of them run in
// first's batch. It returns each one's error (a panic that InTx passed on
// becomes an error naming it).
func joined(t *testing.T, s *sqlStore, first func(Tx) error, others ...func(Tx) error) (errs []error, firstErr error) {
	t.Helper()
	ctx := context.Background()
	errs = make([]error, len(others))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, fn := range others {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					errs[i] = fmt.Errorf("panicked: %v", p)
				}
			}()
			<-start
			errs[i] = s.InTx(ctx, fn)
		})
	}
	firstErr = s.InTx(ctx, func(tx Tx) error {
		close(start)
		for s.batch.waiting.Load() < int32(len(others)) {
			runtime.Gosched()
		}
		return first(tx)
	})
	wg.Wait()
	return errs, firstErr
}

func create(name string) func(Tx) error {
	return func(tx Tx) error {
		_, err := tx.Spaces().Create(context.Background(), space(name))
		return err
	}
}

var errTest = errors.New("test failure")

// TestGroupCommit: transactions that wait for SQLite's writer run in one
// batch and commit once; each behaves as its own transaction.
func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	t.Run("one commit, a failed member's writes undone", func(t *testing.T) {
		s, commits := openBatching(t)
		before := commits.Load()
		errs, firstErr := joined(t, s, create("a"),
			func(tx Tx) error {
				if err := create("b")(tx); err != nil {
					return err
				}
				return errTest
			},
			create("c"),
		)
		if firstErr != nil || errs[1] != nil || !errors.Is(errs[0], errTest) {
			t.Fatalf("errors %v, %v: want nil, [%v nil]", firstErr, errs, errTest)
		}
		if n := commits.Load() - before; n != 1 {
			t.Errorf("%d commits, want 1", n)
		}
		for name, want := range map[string]bool{"a": true, "b": false, "c": true} {
			_, err := s.Spaces().Get(ctx, "", name)
			if got := err == nil; got != want || err != nil && !errors.Is(err, ErrNotFound) {
				t.Errorf("space %s stored %v (%v), want %v", name, got, err, want)
			}
		}
	})

	t.Run("a member sees the writes of the members before it", func(t *testing.T) {
		s, _ := openBatching(t)
		var seen error
		errs, _ := joined(t, s, create("a"), func(tx Tx) error {
			_, seen = tx.Spaces().Get(ctx, "", "a")
			return nil
		})
		if errs[0] != nil || seen != nil {
			t.Fatalf("member after the create: %v, read %v", errs[0], seen)
		}
	})

	t.Run("a failed first member ends the batch; the others commit", func(t *testing.T) {
		s, _ := openBatching(t)
		errs, firstErr := joined(t, s, func(tx Tx) error {
			if err := create("a")(tx); err != nil {
				return err
			}
			return errTest
		}, create("b"))
		if !errors.Is(firstErr, errTest) || errs[0] != nil {
			t.Fatalf("errors %v, %v: want %v, nil", firstErr, errs, errTest)
		}
		if _, err := s.Spaces().Get(ctx, "", "a"); !errors.Is(err, ErrNotFound) {
			t.Errorf("the failed member's space: %v, want not found", err)
		}
		if _, err := s.Spaces().Get(ctx, "", "b"); err != nil {
			t.Errorf("the member after it: %v", err)
		}
	})

	t.Run("a conflict in one member leaves the others", func(t *testing.T) {
		s, _ := openBatching(t)
		sp, err := s.Spaces().Create(ctx, space("x"))
		if err != nil {
			t.Fatal(err)
		}
		update := func(tx Tx) error {
			_, err := tx.Spaces().Update(ctx, sp)
			return err
		}
		// Both update version 1: the second to run must conflict.
		errs, firstErr := joined(t, s, update, update, create("y"))
		if firstErr != nil || !errors.Is(errs[0], ErrConflict) || errs[1] != nil {
			t.Fatalf("errors %v, %v: want nil, [conflict nil]", firstErr, errs)
		}
		if got, err := s.Spaces().Get(ctx, "", "x"); err != nil || got.GetMetadata().GetVersion() != 2 {
			t.Fatalf("space x: version %d (%v), want 2", got.GetMetadata().GetVersion(), err)
		}
	})

	t.Run("a panic reaches its caller; the others commit", func(t *testing.T) {
		s, _ := openBatching(t)
		errs, firstErr := joined(t, s, create("a"), func(tx Tx) error {
			if err := create("p")(tx); err != nil {
				return err
			}
			panic("test panic")
		})
		if firstErr != nil || errs[0] == nil || errs[0].Error() != "panicked: test panic" {
			t.Fatalf("errors %v, %v: want nil, [panicked: test panic]", firstErr, errs)
		}
		if _, err := s.Spaces().Get(ctx, "", "a"); err != nil {
			t.Errorf("the first member: %v", err)
		}
		if _, err := s.Spaces().Get(ctx, "", "p"); !errors.Is(err, ErrNotFound) {
			t.Errorf("the panicking member's space: %v, want not found", err)
		}
		// The writer is usable afterwards.
		if err := s.InTx(ctx, create("after")); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a cancelled context", func(t *testing.T) {
		s, _ := openBatching(t)
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		ran := false
		if err := s.InTx(cancelled, func(Tx) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
			t.Fatalf("InTx with a cancelled context: %v (fn ran: %v)", err, ran)
		}
	})
}

// TestExclusiveWaitsForTheOpenBatch: the checkpointer's exclusive section
// runs only when no transaction is open, and a batch that someone would
// have kept open commits for it.
func TestExclusiveWaitsForTheOpenBatch(t *testing.T) {
	ctx := context.Background()
	s, _ := openBatching(t)
	var ran, open bool
	var seen error
	var wg sync.WaitGroup
	errs, _ := joined(t, s, func(tx Tx) error {
		wg.Go(func() {
			s.batch.exclusive(func() {
				ran, open = true, s.batch.cur != nil
				_, seen = s.Spaces().Get(ctx, "", "a")
			})
		})
		for s.batch.exclusiveWaiting.Load() == 0 {
			runtime.Gosched()
		}
		return create("a")(tx)
	}, create("b"))
	wg.Wait()
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if !ran || open || seen != nil {
		t.Fatalf("exclusive ran %v, with a batch open %v, saw the committed space: %v", ran, open, seen)
	}
}
