package router

import (
	"testing"

	"github.com/torpor-dev/torpor/internal/metricstest"
)

// TestMetricsHelp: every router metric's HELP text names its labels.
func TestMetricsHelp(t *testing.T) {
	var r metricstest.Recorder
	if _, err := newMetrics(&r); err != nil {
		t.Fatal(err)
	}
	metricstest.HelpNamesLabels(t, r.Collectors...)
}
