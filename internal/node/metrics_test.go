package node

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/torpor-dev/torpor/internal/metricstest"
)

func TestMetricsCountOperationsOnce(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	for range 2 { // the retry is answered from the record, not executed
		if _, err := n.run(ctx, "a1", "op-1", 0); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := n.running.http.Get(n.running.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`torpor_node_operations_total{method="Run",result="ok"} 1`,
		`torpor_node_operation_seconds_count{method="Run"} 1`,
		`torpor_node_busy_workers 1`,
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestMetricsHelp: every node agent metric's HELP text names its labels.
func TestMetricsHelp(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry(), func() int { return 0 })
	metricstest.HelpNamesLabels(t, m.operations, m.seconds, m.steps, actorUsage{})
}
