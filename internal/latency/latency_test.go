package latency

import (
	"math"
	"testing"
	"time"
)

func TestMillis(t *testing.T) {
	var s Samples
	if !math.IsNaN(s.Millis(0.5)) {
		t.Error("a quantile of no samples is not NaN")
	}
	for _, ms := range []int{5, 1, 4, 2, 3, 100, 6, 7, 8, 9} {
		s.Add(time.Duration(ms) * time.Millisecond)
	}
	for _, tc := range []struct {
		q    float64
		want float64
	}{{0.1, 1}, {0.5, 5}, {0.9, 9}, {0.95, 100}, {0.99, 100}, {1, 100}} {
		if got := s.Millis(tc.q); got != tc.want {
			t.Errorf("Millis(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
}
