package router

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
)

// Results of a resume, the label of torpor_router_resumes_total.
const (
	resumeRunning     = "running"     // the actor is RUNNING
	resumeNoWorker    = "no_worker"   // no worker was free within the park bound
	resumeTimeout     = "timeout"     // the resume outlasted ResumeTimeout
	resumeUnavailable = "unavailable" // the control plane could not answer within the park bound
	resumeNotFound    = "not_found"   // the actor does not exist (any more)
	resumeFailed      = "error"       // anything else the control plane answered
)

type metrics struct {
	activation *prometheus.HistogramVec
	resumes    *prometheus.CounterVec
	requests   *prometheus.CounterVec
	// byStatus caches requests' counter of each status code (100–599)
	// once used: a label lookup hashes the label on every request.
	byStatus [600]atomic.Pointer[prometheus.Counter]
	parked   prometheus.Gauge
	reports  *prometheus.CounterVec
	// requestCalls counts the control-plane calls requests waited for;
	// divided by requests it is the calls per proxied request (near 0 when
	// the placements are known).
	requestCalls  *prometheus.CounterVec
	watchRestarts prometheus.Counter
	gateParks     prometheus.Counter
}

// Calls a request may wait for, the label of
// torpor_router_request_control_plane_calls_total.
const (
	callGet    = "get_actor"
	callResume = "resume_actor"
	callReport = "report_activity"
	// callLookupSandbox resolves a sandbox ID the router has not cached,
	// or one it does not place.
	callLookupSandbox = "lookup_sandbox"
)

// activationOf is the activation histogram of the resumed actor a.
func (m *metrics) activationOf(a *torporv1.Actor) prometheus.Observer {
	template, _, _ := strings.Cut(a.GetStatus().GetCurrentTemplate(), "@")
	restore := "unknown"
	if scope := a.GetStatus().GetRestoredBy(); scope != torporv1.RestoreScope_RESTORE_SCOPE_UNSPECIFIED {
		restore = strings.ToLower(enum.Name(scope))
	}
	return m.activation.WithLabelValues(template, restore)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		activation: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "torpor_router_activation_seconds",
			Help: "Time from the arrival of a request for a non-running actor to the first response byte from its workload, by the actor's template (name) and restore (how the resume restored it: full, data, data_on_golden, boot).",
			// Activation targets ~100 ms; the tail reaches into cold boots.
			Buckets: []float64{.01, .025, .05, .075, .1, .15, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"template", "restore"}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_router_resumes_total",
			Help: "Resumes this router asked for (one per actor however many requests waited), by result: running, no_worker, timeout, unavailable, not_found, error.",
		}, []string{"result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_router_requests_total",
			Help: "Requests by HTTP status code (499: the client went away before an answer); the admin endpoints are not counted.",
		}, []string{"code"}),
		parked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "torpor_router_parked_requests",
			Help: "Requests waiting for their actor to be resumed, including those waiting for a free worker, and those waiting for the slot gate of their actor's node to answer.",
		}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "torpor_router_activity_reports_total",
			Help: "Activity reports this router sent to the control plane, by result (ok, error).",
		}, []string{"result"}),
	}
	m.requestCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "torpor_router_request_control_plane_calls_total",
		Help: "Control-plane calls made while a request waited, by call (get_actor, resume_actor, report_activity, lookup_sandbox); over torpor_router_requests_total, the calls per proxied request. Batched activity reports and the placement watch are not counted.",
	}, []string{"call"})
	m.watchRestarts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "torpor_router_placement_watch_restarts_total",
		Help: "Times the placement watch ended (the control plane restarted or was out of reach) and was resumed.",
	})
	m.gateParks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "torpor_router_gate_parked_requests_total",
		Help: "Requests and tunnels that waited (parked) because the slot gate of their actor's node did not answer: its node agent restarting, or the node out of reach.",
	})
	for _, c := range []prometheus.Collector{m.activation, m.resumes, m.requests, m.parked, m.reports, m.requestCalls, m.watchRestarts, m.gateParks} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register router metrics: %w", err)
		}
	}
	// Export every result from the start so rates over them are defined.
	for _, r := range []string{resumeRunning, resumeNoWorker, resumeTimeout, resumeUnavailable, resumeNotFound, resumeFailed} {
		m.resumes.WithLabelValues(r)
	}
	return m, nil
}

// countRequest counts one request answered with status.
func (m *metrics) countRequest(status int) {
	if status < 100 || status >= len(m.byStatus) {
		m.requests.WithLabelValues(strconv.Itoa(status)).Inc()
		return
	}
	if c := m.byStatus[status].Load(); c != nil {
		(*c).Inc()
		return
	}
	c := m.requests.WithLabelValues(strconv.Itoa(status))
	m.byStatus[status].Store(&c)
	c.Inc()
}
