// Package latency keeps measured durations and reports their percentiles
// as benchmark metrics.
package latency

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"
)

// Samples are measured durations, in any order.
type Samples []time.Duration

// Add records one duration.
func (s *Samples) Add(d time.Duration) { *s = append(*s, d) }

// Millis is the q-quantile (0 < q ≤ 1, nearest rank) in milliseconds; NaN
// without samples.
func (s Samples) Millis(q float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	sorted := slices.Clone(s)
	slices.Sort(sorted)
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return float64(sorted[max(i, 0)].Nanoseconds()) / 1e6
}

// Report adds name-pNN-ms metrics for quantiles (0.5 → p50, 0.95 → p95,
// 0.99 → p99). Nothing without samples.
func (s Samples) Report(b *testing.B, name string, quantiles ...float64) {
	s.report(b, name, "ms", 1, quantiles)
}

// ReportMicros is Report in microseconds (name-pNN-us).
func (s Samples) ReportMicros(b *testing.B, name string, quantiles ...float64) {
	s.report(b, name, "us", 1000, quantiles)
}

func (s Samples) report(b *testing.B, name, unit string, scale float64, quantiles []float64) {
	if len(s) == 0 {
		return
	}
	for _, q := range quantiles {
		b.ReportMetric(s.Millis(q)*scale, fmt.Sprintf("%s-p%s-%s", name, strconv.FormatFloat(q*100, 'f', -1, 64), unit))
	}
}
