package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

var errTransient = errors.New("transient")

func TestDo(t *testing.T) {
	permanent := errors.New("permanent")
	tests := []struct {
		name      string
		errs      []error // what successive attempts return; nil ends
		budget    time.Duration
		wantCalls int
		wantErr   error
	}{
		{name: "first try", errs: []error{nil}, wantCalls: 1},
		{name: "transient then success", errs: []error{errTransient, errTransient, nil}, wantCalls: 3},
		{name: "permanent stops at once", errs: []error{errTransient, permanent, nil}, wantCalls: 2, wantErr: permanent},
		{name: "budget spent", errs: []error{errTransient, errTransient, errTransient, errTransient, errTransient, errTransient, errTransient, errTransient}, budget: 15 * time.Millisecond, wantErr: errTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := Do(context.Background(), Policy{Initial: 5 * time.Millisecond, Max: 10 * time.Millisecond, Budget: tt.budget},
				func(err error) bool { return errors.Is(err, errTransient) },
				func(context.Context) error {
					err := tt.errs[min(calls, len(tt.errs)-1)]
					calls++
					return err
				})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if tt.wantCalls > 0 && calls != tt.wantCalls {
				t.Fatalf("%d calls, want %d", calls, tt.wantCalls)
			}
			if tt.budget > 0 && calls >= len(tt.errs) {
				t.Fatalf("%d calls: the budget of %s did not stop the retries", calls, tt.budget)
			}
		})
	}
}

func TestDoStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Do(ctx, Policy{Initial: time.Hour}, func(error) bool { return true }, func(context.Context) error {
		calls++
		cancel()
		return errTransient
	})
	if !errors.Is(err, errTransient) || calls != 1 {
		t.Fatalf("err = %v after %d calls, want the transient error after 1", err, calls)
	}
}

func TestWaitsAreJittered(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 20 {
		seen[Policy{Initial: time.Second, Max: time.Second}.Start().Next()] = true
	}
	if len(seen) < 2 {
		t.Fatalf("20 first waits were all %v: no jitter", seen)
	}
	for d := range seen {
		if d < 500*time.Millisecond || d > 1500*time.Millisecond {
			t.Fatalf("first wait %s is outside 1s ± 50%%", d)
		}
	}
}
