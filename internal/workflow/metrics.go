package workflow

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// metrics count the engine's steps by kind and result.
type metrics struct {
	steps         *prometheus.CounterVec
	stepSeconds   *prometheus.HistogramVec
	snapshotBytes *prometheus.CounterVec
	// Capacity (idle.go, evict.go).
	stops          *prometheus.CounterVec
	stopsCancelled prometheus.Counter
	evictionWait   prometheus.Histogram
	noEvictable    prometheus.Counter
	// Warm workers (warmworkers.go).
	warmed *prometheus.CounterVec
	// E2B sandboxes' leases (leases.go).
	leaseEnds *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_workflow_steps_total",
			Help: "Workflow steps by kind (resume, suspend, pause, delete, golden) and result (ok or a status code).",
		}, []string{"kind", "result"}),
		stepSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "torpor_workflow_step_seconds",
			Help:    "Duration of successful workflow steps, intent to finalize, by kind (resume, suspend, pause, delete, golden).",
			Buckets: []float64{.005, .01, .025, .05, .1, .2, .3, .5, 1, 2, 5, 10, 30},
		}, []string{"kind"}),
		snapshotBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_snapshot_bytes_total",
			Help: "Bytes of snapshots committed, by kind (suspend, pause, golden).",
		}, []string{"kind"}),
		stops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_idle_stops_total",
			Help: "Actors paused or suspended by the control plane, by reason (idle: their idle policy; eviction: a resume needed their worker), action (pause, suspend) and template.",
		}, []string{"reason", "action", "template"}),
		stopsCancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "torpor_idle_stops_cancelled_total",
			Help: "Idle stops and evictions cancelled after their claim because a request for the actor arrived.",
		}),
		evictionWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "torpor_resume_eviction_wait_seconds",
			Help:    "Time a resume waited for the eviction that freed its worker.",
			Buckets: []float64{.01, .025, .05, .1, .2, .3, .5, 1, 2, 5, 10, 30},
		}),
		noEvictable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "torpor_resume_no_worker_total",
			Help: "Resumes answered ResourceExhausted: no free worker fits and no running actor can be evicted.",
		}),
		warmed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_workers_warmed_total",
			Help: "Free workers the control plane had warmed for a template's next actor (TemplateSpec.warm_workers), by template.",
		}, []string{"template"}),
		leaseEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_sandbox_lease_ends_total",
			Help: "E2B sandboxes whose lease ended, by action (kill: deleted without a snapshot; pause: suspended, as auto_pause asked).",
		}, []string{"action"}),
	}
	if reg != nil {
		reg.MustRegister(m.steps, m.stepSeconds, m.snapshotBytes, m.stops, m.stopsCancelled, m.evictionWait, m.noEvictable, m.warmed, m.leaseEnds)
	}
	return m
}

// observe records one step's outcome.
func (m *metrics) observe(kind string, start time.Time, err error) {
	result := "ok"
	if err != nil {
		result = errdefs.Code(err).String()
	} else {
		m.stepSeconds.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	}
	m.steps.WithLabelValues(kind, result).Inc()
}
