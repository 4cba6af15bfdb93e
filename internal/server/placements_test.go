package server

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/store"
)

// history is an actors' history whose entries become visible out of
// order, as PostgreSQL's commits do.
type history struct{ visible []int64 }

func (h *history) ActorChanges(_ context.Context, after int64, limit int) ([]store.ActorChange, error) {
	var out []store.ActorChange
	for _, seq := range h.visible {
		if seq > after && len(out) < limit {
			out = append(out, store.ActorChange{Seq: seq, ActorUID: "a"})
		}
	}
	return out, nil
}

func (h *history) LatestChange(context.Context) (int64, error) { return slices.Max(h.visible), nil }

func seqs(changes []store.ActorChange) []int64 {
	var out []int64
	for _, c := range changes {
		out = append(out, c.Seq)
	}
	return out
}

// A watch sends an entry committed late behind one it already sent, and
// its resume version never passes a gap until the gap is filled or given
// up for a rollback.
func TestFeedLooksBehindGaps(t *testing.T) {
	ctx := context.Background()
	h := &history{visible: []int64{1, 2, 4}}
	f := newFeed(0)
	t0 := time.Now()
	got, err := f.next(ctx, h, t0)
	if err != nil || !slices.Equal(seqs(got), []int64{1, 2, 4}) || f.low != 2 {
		t.Fatalf("first read: %v, %v, low %d; want [1 2 4], low 2 (3 is missing)", seqs(got), err, f.low)
	}
	h.visible = []int64{1, 2, 4, 3, 5} // 3 commits after 4
	got, _ = f.next(ctx, h, t0.Add(time.Second))
	if !slices.Equal(seqs(got), []int64{3, 5}) || f.low != 5 {
		t.Fatalf("after the late commit: %v, low %d; want [3 5], low 5", seqs(got), f.low)
	}
	h.visible = append(h.visible, 7) // 6 rolled back
	got, _ = f.next(ctx, h, t0.Add(2*time.Second))
	if !slices.Equal(seqs(got), []int64{7}) || f.low != 5 {
		t.Fatalf("past a gap: %v, low %d; want [7], low 5", seqs(got), f.low)
	}
	got, _ = f.next(ctx, h, t0.Add(2*time.Second+placementGapWait+time.Millisecond))
	if len(got) != 0 || f.low != 7 {
		t.Fatalf("after the gap wait: %v, low %d; want nothing new, low 7", seqs(got), f.low)
	}
}
