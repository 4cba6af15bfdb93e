// Package router is Torpor's HTTP ingress. It maps each request to an actor
// (Host <actor>.<space>.<domain> or the Torpor-Actor header), resumes the
// actor on demand when it is not running (one resume per actor however many
// requests wait; parked, bounded, while no worker is free), proxies to the
// actor's workload on its worker (streams and protocol upgrades included),
// and reports the actors' activity to the control plane, which applies the
// templates' idle policies and evicts idle actors when workers run out.
//
// Metrics (Prometheus, served by Admin at /metrics):
// torpor_router_activation_seconds (arrival of a request for a non-running
// actor to the first response byte from its workload),
// torpor_router_resumes_total{result}, torpor_router_requests_total{code},
// torpor_router_parked_requests (resumes and gates waited for),
// torpor_router_gate_parked_requests_total (gatepark.go) and
// torpor_router_activity_reports_total{result}. Admin is meant for a listener of its own; with
// Config.AdminOnIngress the ingress serves it too, but only to requests that
// name no actor, so an actor's own /metrics stays reachable.
//
// What clients are told: every answer carries a request id (header
// Torpor-Request-Id). An answer the router makes itself (4xx, 5xx) says
// what happened to the actor and what to do, and gives the request id;
// what lies behind it (uids, worker addresses, node and runtime messages)
// goes only to the router's log line of that request id, and to the
// actor's events for its users. Router clients are anyone who can reach the
// ingress, not only the actor's owners.
package router

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/slotgate"
	"github.com/torpor-dev/torpor/internal/tracing"
	"github.com/torpor-dev/torpor/internal/version"
)

// Defaults of Config.
const (
	DefaultParkTimeout    = 10 * time.Second
	DefaultResumeTimeout  = 30 * time.Second
	DefaultReportInterval = 250 * time.Millisecond
)

// Config configures a Router.
type Config struct {
	// Server is the control plane's API base URL, e.g. http://127.0.0.1:7070.
	Server string
	// HTTPClient carries the API calls. Default http.DefaultClient.
	HTTPClient connect.HTTPClient
	// Domain is the parent domain of actor host names. Default
	// DefaultDomain.
	Domain string
	// ParkTimeout bounds how long a resume keeps asking for a free worker,
	// and how long a read or a resume keeps asking a control plane that
	// cannot answer (restarting, or its database restarting), before the
	// requests waiting for it are answered 503 with Retry-After. It runs
	// from the start of each (requests that joined a resume later wait
	// less). Default 10s.
	ParkTimeout time.Duration
	// ResumeTimeout bounds how long requests wait for one resume call
	// before they are answered 504. Default 30s.
	ResumeTimeout time.Duration
	// ReportInterval is how often Run reports the actors' activity to the
	// control plane: one call per interval, however many requests.
	// Default 250ms.
	ReportInterval time.Duration
	// Name is the router's name in activity reports (each reporter's
	// in-flight counts are its own). Default a random router-<id>.
	Name string
	// AdminOnIngress serves the admin endpoints (/metrics, /healthz) from
	// ServeHTTP to requests that name no actor. Requests naming an actor
	// always go to the actor, whatever their path, so the two never collide.
	AdminOnIngress bool
	Logger         *slog.Logger
	// Registerer receives the router's metrics. Default: a new
	// version.NewRegistry.
	Registerer prometheus.Registerer
	// Gatherer is what /metrics serves. Default: Registerer when it is a
	// Gatherer (a *prometheus.Registry is both).
	Gatherer prometheus.Gatherer
}

// actorAPI is the part of the control plane the router uses.
type actorAPI interface {
	GetActor(context.Context, *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error)
	ResumeActor(context.Context, *connect.Request[torporv1.ResumeActorRequest]) (*connect.Response[torporv1.Actor], error)
	ReportActivity(context.Context, *connect.Request[torporv1.ReportActivityRequest]) (*connect.Response[torporv1.ReportActivityResponse], error)
}

// Router is an http.Handler serving actors' traffic; Run reports their
// activity.
type Router struct {
	cfg     Config
	api     actorAPI
	watcher placementWatcher
	// sandboxAPI resolves E2B sandbox IDs; sandboxes caches its answers.
	sandboxAPI sandboxAPI
	sandboxes  *sandboxTable
	// dialer connects to slot gates, for proxied requests and tunnels.
	dialer  net.Dialer
	log     *slog.Logger
	metrics *metrics
	actors  *actorTable
	flights flights
	proxy   *proxy
	admin   http.Handler
	// draining: Drain was called; hijacked: the connections upgrades
	// and tunnels took over (drain.go).
	draining atomic.Bool
	hijacked hijackedConns
}

// New returns a router over the control plane at cfg.Server.
func New(cfg Config) (*Router, error) {
	if cfg.Server == "" {
		return nil, errors.New("router config: Server (the API base URL) is required")
	}
	domain, err := normalizeDomain(cfg.Domain)
	if err != nil {
		return nil, fmt.Errorf("router config: %w", err)
	}
	cfg.Domain = domain
	for _, d := range []struct {
		name string
		val  *time.Duration
		def  time.Duration
	}{
		{"ParkTimeout", &cfg.ParkTimeout, DefaultParkTimeout},
		{"ResumeTimeout", &cfg.ResumeTimeout, DefaultResumeTimeout},
		{"ReportInterval", &cfg.ReportInterval, DefaultReportInterval},
	} {
		switch {
		case *d.val < 0:
			return nil, fmt.Errorf("router config: %s %s must not be negative", d.name, *d.val)
		case *d.val == 0:
			*d.val = d.def
		}
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = http.DefaultClient
	}
	if cfg.Name == "" {
		cfg.Name = "router-" + strings.ToLower(rand.Text()[:10])
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registerer == nil {
		reg := version.NewRegistry()
		cfg.Registerer, cfg.Gatherer = reg, reg
	}
	if cfg.Gatherer == nil {
		g, ok := cfg.Registerer.(prometheus.Gatherer)
		if !ok {
			return nil, errors.New("router config: Gatherer is required when Registerer is not a Gatherer")
		}
		cfg.Gatherer = g
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	placements := torporv1connect.NewPlacementServiceClient(cfg.HTTPClient, cfg.Server, connect.WithInterceptors(tracing.Interceptor()))
	r := &Router{
		cfg:        cfg,
		api:        torporv1connect.NewActorServiceClient(cfg.HTTPClient, cfg.Server, connect.WithInterceptors(tracing.Interceptor())),
		watcher:    placements,
		sandboxAPI: placements,
		sandboxes:  newSandboxTable(),
		dialer:     net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		log:        cfg.Logger,
		metrics:    m,
		actors:     newActorTable(),
		flights:    flights{m: map[ActorKey]*resumeFlight{}},
	}
	r.proxy = newProxy(r.log, &r.dialer)
	admin := http.NewServeMux()
	admin.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{ErrorLog: slogPrinter{r.log}}))
	admin.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if r.draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	r.admin = admin
	return r, nil
}

// Domain is the parent domain of actor host names, normalized.
func (r *Router) Domain() string { return r.cfg.Domain }

// Admin serves /metrics (Prometheus) and /healthz (503 "draining" once
// Drain was called), for a listener of its own or, with AdminOnIngress,
// through ServeHTTP.
func (r *Router) Admin() http.Handler { return r.admin }

// RequestIDHeader carries the id the router gives each request it serves;
// the router's log line for the request carries it too, with the whole
// error of a request that failed.
const RequestIDHeader = "Torpor-Request-Id"

// route is where a request goes: an actor, on its template's port, or a
// port of a sandbox (an actor too, once the sandbox index has said which).
type route struct {
	key ActorKey
	// sandbox is set for a request addressed to a sandbox, and port is
	// then the port it asked for.
	sandbox *sandboxRef
	port    int
}

// ServeHTTP routes one request to its actor or sandbox.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	addr, err := addressOf(req, r.cfg.Domain)
	rt := route{key: addr.actor}
	if errors.Is(err, errNoActor) && r.cfg.AdminOnIngress && (req.URL.Path == "/metrics" || req.URL.Path == "/healthz") {
		r.admin.ServeHTTP(w, req)
		return
	}
	rec := &recorder{ResponseWriter: w, id: rand.Text(), hijacked: &r.hijacked}
	w.Header().Set(RequestIDHeader, rec.id)
	var resumed time.Duration
	// Deferred so the log line is written even when the proxy aborts a
	// response half way (it panics with http.ErrAbortHandler).
	defer func() {
		status := rec.status
		if status == 0 {
			status = statusClientGone
		}
		r.metrics.countRequest(status)
		level := slog.LevelInfo
		if rec.err != nil && status >= http.StatusInternalServerError && !rec.expected {
			level = slog.LevelWarn
		}
		// Built only for a handler that writes it: a request's line is a
		// dozen attributes, most of the router's own allocations.
		if !r.log.Enabled(req.Context(), level) {
			return
		}
		actor := ""
		if rt.key != (ActorKey{}) {
			actor = rt.key.String()
		}
		attrs := make([]slog.Attr, 0, 12)
		attrs = append(attrs, slog.String("request_id", rec.id), slog.String("actor", actor), slog.String("method", req.Method),
			slog.String("path", req.URL.Path), slog.Int("status", status), slog.Duration("duration", time.Since(start)),
			slog.Int64("bytes", rec.bytes.Load()))
		if addr.sandbox != "" {
			attrs = append(attrs, slog.String("sandbox", addr.sandbox), slog.Int("port", addr.port))
		}
		if resumed > 0 {
			attrs = append(attrs, slog.Duration("resume", resumed))
		}
		if rec.err != nil {
			attrs = append(attrs, slog.Any("err", rec.err))
		}
		r.log.LogAttrs(req.Context(), level, "request", attrs...)
	}()
	if err != nil {
		if errors.Is(err, errNoActor) {
			err = fmt.Errorf("%w: address it with Host: <actor>.<space>.%s or the header %s: <space>/<actor>, or a sandbox with Host: <port>-<sandbox id>.%s or the headers %s and %s",
				err, r.cfg.Domain, ActorHeader, r.cfg.Domain, SandboxIDHeader, SandboxPortHeader)
		}
		// The message speaks only of the Host or header the client sent.
		rec.answer(http.StatusBadRequest, err.Error(), err)
		return
	}
	if addr.sandbox != "" {
		if req.Method == http.MethodConnect {
			err = fmt.Errorf("sandbox %s: tunnels (CONNECT) address actors, as <actor>.<space>.%s:<port>; a sandbox's ports are reached as <port>-<sandbox id>.%s", addr.sandbox, r.cfg.Domain, r.cfg.Domain)
			rec.answer(http.StatusMethodNotAllowed, err.Error(), err)
			return
		}
		ref, lookErr := r.sandbox(req.Context(), addr.sandbox)
		ref.id = addr.sandbox
		rt = route{key: ref.key, sandbox: &ref, port: addr.port}
		if lookErr != nil {
			r.writeError(rec, req, rt, lookErr)
			return
		}
	}
	if req.ContentLength != 0 {
		// Let the workload answer while the body is still arriving, as it
		// would without the router in between; HTTP/1 servers otherwise
		// swallow the rest of the body once the answer starts. (HTTP/2 is
		// always full duplex and says so with an error, ignored.)
		_ = http.NewResponseController(w).EnableFullDuplex()
	}
	if req.Method == http.MethodConnect {
		r.serveTunnel(rec, req, rt.key, start, &resumed)
		return
	}
	r.serveActor(rec, req, rt, start, &resumed)
}

// statusClientGone is logged and counted for requests whose client went
// away before any answer (the nginx convention).
const statusClientGone = 499

// serveActor proxies req to the actor (or sandbox) of rt, resuming it
// first if needed (for a sandbox, only if it was created with
// autoResume); *resumed is how long the request waited for a resume (0
// when it did not).
func (r *Router) serveActor(w *recorder, req *http.Request, rt route, start time.Time, resumed *time.Duration) {
	key := rt.key
	ctx, span := tracing.Start(req.Context(), "router.request", attribute.String("actor", key.String()), attribute.String("request_id", w.id))
	defer span.End()
	req = req.WithContext(ctx)
	// Reported before the actor is looked up, so an idle stop claimed
	// after that lookup found it RUNNING sees this request (activity.go).
	if r.actors.enter(key, start) {
		r.syncReport(ctx, key)
	}
	defer func() { r.actors.leave(key, time.Now()) }()

	// The activation is labelled with the resume's outcome, which a
	// re-resolve after a failed attempt does not repeat.
	var activation prometheus.Observer
	body := holdBody(req)
	var park gatePark
	refusals, cuts := 0, 0
	for fresh := false; ; fresh = true {
		at, woken, err := r.resolve(ctx, &rt, fresh, resumed)
		if woken != nil {
			activation = r.metrics.activationOf(woken)
		}
		if err != nil {
			r.writeError(w, req, rt, err)
			return
		}
		// The placement is the table's (forget compares it); the target
		// is the port the request asked for.
		dest := at
		if rt.port != 0 {
			dest.target.Port = rt.port
		}
		outcome, err := r.proxy.serve(w, req, proxyTarget{
			actor: key, at: dest, activationStart: activationStart(start, *resumed), activation: activation,
		}, body)
		if outcome == proxied {
			return
		}
		next, kept := body.again()
		switch {
		case outcome == refused && refusals < maxRefusals:
			// The gate's refusal proves the placement stale (and that
			// nothing was sent): resolved again whatever its source.
			refusals++
		case outcome == unreachable && !fresh && *resumed == 0:
			// A placement from the table may be stale; a workload that
			// was just resumed has passed its readiness probe, so
			// failing to reach it is its own fault.
		case outcome == gateDown:
			if !r.waitGate(ctx, &park) {
				r.writeError(w, req, rt, fmt.Errorf("actor %s at %s: %w for %s: %w", key, dest.target, errGateDown, r.cfg.ParkTimeout, err))
				return
			}
		case outcome == cut && cuts == 0 && kept && !w.written() && replayable(req):
			// Once: a workload that cuts the request again is answering.
			cuts++
		default:
			if errors.Is(err, slotgate.ErrUnreachable) {
				err = &closedPort{port: dest.target.Port, err: err}
			}
			r.writeError(w, req, rt, fmt.Errorf("actor %s at %s: %w: %w", key, dest.target, errNoAnswer, err))
			return
		}
		r.log.Debug("placement refused or unreachable, resolving again", "actor", key.String(), "placement", dest.target.String(), "err", err)
		body = next
		r.actors.forget(key, at)
	}
}

// maxRefusals bounds how often one request is sent back by slot gates
// (its placement was stale) before it is answered 502: after the first,
// placements come from the control plane, so a third refusal in a row
// means the control plane and the node disagree.
const maxRefusals = 2

func activationStart(start time.Time, resumed time.Duration) time.Time {
	if resumed == 0 {
		return time.Time{}
	}
	return start
}

// resolveActor returns where the actor's workload runs, resuming the
// actor if it is not running, and the actor as the resume left it (nil
// when there was none); *resumed grows by the time spent waiting for a
// resume. fresh skips the table and asks the control plane. A request to
// a running actor the table knows makes no call; one the table does not
// place makes one, ResumeActor, which answers a RUNNING actor as it is
// and resumes a stopped one: the table holds every running actor it may
// see (the placement watch), so an actor missing from it is most likely
// stopped, and asking what it is first would be a second round trip on
// every activation.
func (r *Router) resolveActor(ctx context.Context, key ActorKey, fresh bool, resumed *time.Duration) (placement, *torporv1.Actor, error) {
	if !fresh {
		if at, ok := r.actors.placement(key); ok {
			return at, nil, nil
		}
	}
	return r.resumeFor(ctx, key, resumed)
}

// resolve is resolveActor or, for a sandbox, resolveSandbox.
func (r *Router) resolve(ctx context.Context, rt *route, fresh bool, resumed *time.Duration) (placement, *torporv1.Actor, error) {
	if rt.sandbox != nil {
		return r.resolveSandbox(ctx, rt.sandbox, fresh, resumed)
	}
	return r.resolveActor(ctx, rt.key, fresh, resumed)
}

// resumeFor waits for the actor to be RUNNING (ResumeActor answers a
// running one as it is) and returns where it runs and the actor.
func (r *Router) resumeFor(ctx context.Context, key ActorKey, resumed *time.Duration) (placement, *torporv1.Actor, error) {
	waitStart := time.Now()
	a, err := r.awaitResume(ctx, key)
	*resumed += max(time.Since(waitStart), time.Nanosecond)
	if connect.CodeOf(err) == connect.CodeFailedPrecondition && r.deleting(ctx, key) {
		// Said here because the resume's refusal carries the control
		// plane's words, which clients do not get.
		return placement{}, nil, fmt.Errorf("actor %s: %w", key, errDeleting)
	}
	if err != nil {
		return placement{}, nil, err
	}
	at, err := actorPlacement(key, a)
	return at, a, err
}

// deleting reports whether the actor is being deleted, for a resume the
// control plane refused. Only that refusal pays for this second call.
func (r *Router) deleting(ctx context.Context, key ActorKey) bool {
	r.metrics.requestCalls.WithLabelValues(callGet).Inc()
	resp, err := r.api.GetActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: key.Space, Name: key.Name}))
	return err == nil && resp.Msg.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_DELETING
}

// learn records where a RUNNING actor runs and returns it.
func (r *Router) learn(key ActorKey, a *torporv1.Actor) (placement, error) {
	at, err := actorPlacement(key, a)
	if err != nil {
		return placement{}, err
	}
	r.actors.learn(key, at)
	return at, nil
}

var (
	errDeleting = errors.New("the actor is being deleted")
	// errNoAnswer: the workload did not answer (refused, reset, closed).
	errNoAnswer = errors.New("the workload did not answer")
)

// slogPrinter adapts slog to promhttp's error log.
type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Error("serve metrics", "err", fmt.Sprint(v...)) }
