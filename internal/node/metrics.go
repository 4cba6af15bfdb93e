package node

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/version"
)

// metrics are the agent's Prometheus metrics, served at /metrics.
type metrics struct {
	registry   *prometheus.Registry
	operations *prometheus.CounterVec
	seconds    *prometheus.HistogramVec
	steps      *prometheus.HistogramVec
	// egressDenied counts what egress policies refused (egress_reports.go).
	egressDenied *prometheus.CounterVec
}

// newMetrics counts operations into reg (nil: a registry of its own);
// busy says how many slots host a workload.
func newMetrics(reg *prometheus.Registry, busy func() int) *metrics {
	if reg == nil {
		reg = version.NewRegistry()
	}
	m := &metrics{
		registry: reg,
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_node_operations_total",
			Help: "Node operations executed (retries answered from the record are not counted), by method and result.",
		}, []string{"method", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "torpor_node_operation_seconds",
			Help:    "Duration of node operations, readiness included, by method.",
			Buckets: []float64{.01, .025, .05, .1, .15, .2, .3, .5, 1, 2, 5, 10, 30},
		}, []string{"method"}),
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "torpor_node_step_seconds",
			Help:    "Duration of the steps of node operations, by operation and step: starting a workload (operation start, step unpack, fetch, volumes, identity, start, ready) and checkpointing one (operation checkpoint, step capture, archive, upload, ...); fetch and upload move snapshots.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"operation", "step"}),
	}
	m.egressDenied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "torpor_egress_denied_total",
		Help: "Connections (packets opening one) and DNS names the actor's egress policy refused on this node, by space and actor.",
	}, []string{"space", "actor"})
	workers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "torpor_node_busy_workers",
		Help: "Worker slots of this node hosting a workload.",
	}, func() float64 { return float64(busy()) })
	m.registry.MustRegister(m.operations, m.seconds, m.steps, m.egressDenied, workers)
	return m
}

func (m *metrics) observe(method string, start time.Time, err error) {
	result := "ok"
	if err != nil {
		result = errdefs.Code(err).String()
	}
	m.operations.WithLabelValues(method, result).Inc()
	m.seconds.WithLabelValues(method).Observe(time.Since(start).Seconds())
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}
