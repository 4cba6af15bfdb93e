package rungroup

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
)

// recorder notes the order in which parts saw their stop.
type recorder struct {
	mu      sync.Mutex
	stopped []string
}

func (r *recorder) part(name string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		<-ctx.Done()
		r.mu.Lock()
		defer r.mu.Unlock()
		r.stopped = append(r.stopped, name)
		return ctx.Err()
	}
}

func TestStopsInReverseOrder(t *testing.T) {
	var r recorder
	g := New(context.Background())
	for _, name := range []string{"api", "node", "router"} {
		g.Go(name, r.part(name))
	}
	if err := g.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if want := []string{"router", "node", "api"}; !slices.Equal(r.stopped, want) {
		t.Errorf("stopped %v, want %v", r.stopped, want)
	}
	ran := false
	g.Go("late", func(context.Context) error { ran = true; return nil })
	if ran || g.Stop() != nil {
		t.Errorf("a part added after Stop ran (%v), or Stop changed its answer", ran)
	}
}

func TestFirstFailureStopsTheRest(t *testing.T) {
	var r recorder
	g := New(context.Background())
	g.Go("api", r.part("api"))
	boom := errors.New("boom")
	g.Go("node", func(context.Context) error { return boom })
	g.Go("router", r.part("router"))
	err := g.Run(context.Background())
	if !errors.Is(err, boom) || err.Error() != "node: boom" {
		t.Errorf("run: %v, want node: boom", err)
	}
	if !errors.Is(g.Err(), boom) {
		t.Errorf("Err: %v", g.Err())
	}
	if want := []string{"router", "api"}; !slices.Equal(r.stopped, want) {
		t.Errorf("stopped %v, want %v", r.stopped, want)
	}
}

func TestPartEndingWithoutErrorFails(t *testing.T) {
	g := New(context.Background())
	g.Go("reports", func(context.Context) error { return nil })
	<-g.Failed()
	if err := g.Stop(); err == nil || err.Error() != "reports: ended" {
		t.Errorf("stop: %v, want reports: ended", err)
	}
}

func TestStopErrorsAreReported(t *testing.T) {
	drain := errors.New("drain timed out")
	g := New(context.Background())
	g.Go("api", func(ctx context.Context) error { <-ctx.Done(); return drain })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Run(ctx); !errors.Is(err, drain) {
		t.Errorf("run: %v, want %v", err, drain)
	}
	if g.Err() != nil {
		t.Errorf("a part stopped as asked counts as a failure: %v", g.Err())
	}
}

func TestPartsOutliveTheParentContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	g := New(ctx)
	started := make(chan context.Context, 1)
	g.Go("api", func(ctx context.Context) error { started <- ctx; <-ctx.Done(); return nil })
	partCtx := <-started
	cancel()
	if partCtx.Err() != nil {
		t.Fatal("cancelling the parent stopped a part: only Stop may")
	}
	g.Stop()
	if partCtx.Err() == nil {
		t.Fatal("Stop left the part running")
	}
}
