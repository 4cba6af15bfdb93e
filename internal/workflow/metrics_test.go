package workflow

import (
	"testing"

	"github.com/torpor-dev/torpor/internal/metricstest"
)

// TestMetricsHelp: every workflow metric's HELP text names its labels.
func TestMetricsHelp(t *testing.T) {
	var r metricstest.Recorder
	newMetrics(&r)
	metricstest.HelpNamesLabels(t, r.Collectors...)
}
