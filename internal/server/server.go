// Package server is Torpor's control plane API: connect handlers (gRPC,
// gRPC-Web and JSON over HTTP on one port) over the store.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/e2b"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/kube"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/tracing"
	"github.com/torpor-dev/torpor/internal/version"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// maxRequestBytes bounds every request so an oversized one is refused
// before it is decoded.
const maxRequestBytes = 4 << 20

// Options configure a server process.
type Options struct {
	// Listen is the TCP address to serve on, e.g. 127.0.0.1:7070;
	// Listener, when set, is served instead (Start).
	Listen   string
	Listener net.Listener
	// Store is "sqlite:PATH" or a postgres:// URL.
	Store string
	// Snapshots is the snapshot storage shared with the nodes: a
	// directory or an s3:// location (snapshot.Open).
	Snapshots string
	// HeartbeatTimeout: a node silent for longer is lost and its actors
	// crash. Default 15s.
	HeartbeatTimeout time.Duration
	// RecoverAfter: a workflow step in flight for longer is re-driven by
	// the periodic sweep (a starting server re-drives all). Default 2m.
	RecoverAfter time.Duration
	// TrustDomain of every identity the CA issues. Default
	// identity.DefaultTrustDomain.
	TrustDomain string
	// Issuer is the iss of workload JWTs, the URL their verifiers find
	// /.well-known/ under. Default https://<Listen> (localhost for an
	// unspecified host).
	Issuer string
	// TLSNames are DNS names and IP addresses the server certificate
	// carries besides the listen host, 127.0.0.1 and localhost: the names
	// clients reach the API by.
	TLSNames []string
	// IngressDomains are the domains routers may have serving
	// certificates for (IssueIngressCertificate): *.<domain> and
	// <domain>. Default: client.DefaultDomain.
	IngressDomains []string
	// MemberCertTTL is the lifetime of node and API client certificates
	// (renewed at two thirds of it). Default identity.DefaultMemberCertTTL.
	MemberCertTTL time.Duration
	// AdminTokenFile, when set, is where Start writes the admin token (mode
	// 0600), and CAFile where it writes the CA certificate (PEM) clients
	// verify the server with.
	AdminTokenFile string
	CAFile         string
	// Headroom is, per worker pool, how many workers to keep free by
	// evicting idle actors early (workflow.Options.Headroom).
	Headroom map[string]int
	// NodeMemoryFloor is the share of a node's memory, in percent, below
	// which its frozen actors go down the idle ladder
	// (workflow.Options.NodeMemoryFloor); 0: never.
	NodeMemoryFloor int
	// Registry receives the control plane's metrics, which it serves at
	// /metrics. Default: a new version.NewRegistry.
	Registry *prometheus.Registry
	Logger   *slog.Logger
	// Images says where templates' images may come from (checked at
	// apply) and how the server reads them for the command check; nil
	// allows none.
	Images *image.Policy
	// E2BDomain is the domain the E2B-compatible API (internal/e2b)
	// answers the SDK with: it reaches a sandbox's port at
	// <port>-<sandboxID>.<E2BDomain>, so it names the routers (a port
	// may follow). Empty: none is answered, and the SDK uses its own
	// (E2B_DOMAIN).
	E2BDomain string
	// E2BListener, when set, serves the E2B-compatible API in plain HTTP
	// (E2BListen names its address, for a listener Start opens). The API
	// port serves it too, under /sandboxes and /v2/sandboxes.
	E2BListen   string
	E2BListener net.Listener
	// Kubernetes, when set, is the cluster the installation runs on:
	// members may join with their pods' ServiceAccount tokens, only its
	// Nodes register as nodes, and their cordons, drains and deletions
	// drive the nodes' lifecycle (kubernetes.go).
	Kubernetes *kube.Cluster
}

// Server is the control plane over one store.
type Server struct {
	store   store.Store
	objects snapshot.ObjectStore
	engine  *workflow.Engine
	opts    Options
	log     *slog.Logger
	// goldens wakes the golden builder when a template is created.
	goldens chan struct{}
	metrics *prometheus.Registry
	// identity is the CA, loaded on first use.
	identity *identity.Loader
	admin    adminToken
	// cert is the certificate the server serves the API with and presents
	// to node agents (see ServeAPI); nil until it serves.
	cert atomic.Pointer[identity.Keypair]

	// agents reaches node agents, for the engine and the data plane.
	agents *nodeAgents
	// sessions are the data-plane calls in flight, reported as activity.
	sessions *sessions
	// relays are the exec calls' input relays (actorService.relays),
	// waited for by Close.
	relays sync.WaitGroup
}

// New returns a server over st and the snapshot object store.
func New(st store.Store, objects snapshot.ObjectStore, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.HeartbeatTimeout == 0 {
		opts.HeartbeatTimeout = workflow.DefaultHeartbeatTimeout
	}
	if opts.RecoverAfter == 0 {
		opts.RecoverAfter = workflow.DefaultRecoverAfter
	}
	reg := opts.Registry
	if reg == nil {
		reg = version.NewRegistry()
	}
	reg.MustRegister(newWorkersCollector(st), newActorsCollector(st), newTemplatesCollector(st))
	s := &Server{store: st, objects: objects, opts: opts, log: opts.Logger, goldens: make(chan struct{}, 1), metrics: reg}
	s.identity = identity.NewLoader(st, s.identityConfig())
	s.admin = adminToken{secrets: st}
	s.agents = newNodeAgents(st, s.agentTLS)
	s.sessions = newSessions(st, opts.Logger)
	s.engine = workflow.New(st, s.agents, snapshotObjects{objects}, workflow.Options{
		HeartbeatTimeout: opts.HeartbeatTimeout,
		RecoverAfter:     opts.RecoverAfter,
		Registerer:       reg,
		Headroom:         opts.Headroom,
		NodeMemoryFloor:  opts.NodeMemoryFloor,
	}, opts.Logger)
	return s
}

// Engine exposes the workflow engine (tests install hooks on it).
func (s *Server) Engine() *workflow.Engine { return s.engine }

// Authority is the installation's CA (loaded from the store, or created by
// the first server to need it).
func (s *Server) Authority(ctx context.Context) (*identity.Authority, error) {
	return s.identity.Authority(ctx)
}

// Handler serves the API. Every call but Join needs a credential (see
// auth.go): an API token, or a client certificate, which the TLS layer of
// ServeAPI verifies.
func (s *Server) Handler() http.Handler { return s.handlers().api }

// handlers are what the server's listeners serve: the API, with the
// E2B-compatible API under its paths (e2b.Prefixes), and that alone.
type handlers struct {
	api http.Handler
	e2b http.Handler
}

func (s *Server) handlers() handlers {
	opts := append([]connect.HandlerOption{
		connect.WithReadMaxBytes(maxRequestBytes),
		connect.WithInterceptors(tracing.Interceptor(), edgeErrors{log: s.log}, &gate{identity: s.identity, admin: &s.admin, log: s.log}),
	}, strictJSONCodecs()...)
	mux := http.NewServeMux()
	mux.Handle(torporv1connect.NewSpaceServiceHandler(&spaceService{store: s.store, engine: s.engine}, opts...))
	mux.Handle(torporv1connect.NewTemplateServiceHandler(&templateService{store: s.store, engine: s.engine, created: s.wakeGoldens, images: s.opts.Images}, opts...))
	mux.Handle(torporv1connect.NewActorServiceHandler(&actorService{store: s.store, engine: s.engine, agents: s.agents, sessions: s.sessions, relays: &s.relays, objects: s.objects}, opts...))
	mux.Handle(torporv1connect.NewWorkerServiceHandler(&workerService{store: s.store, engine: s.engine}, opts...))
	mux.Handle(torporv1connect.NewSnapshotServiceHandler(&snapshotService{store: s.store, engine: s.engine}, opts...))
	mux.Handle(torporv1connect.NewNodeServiceHandler(&nodeService{store: s.store, engine: s.engine, kube: s.opts.Kubernetes}, opts...))
	mux.Handle(torporv1connect.NewPlacementServiceHandler(&placementService{store: s.store}, opts...))
	mux.Handle(torporv1connect.NewSandboxServiceHandler(&sandboxService{store: s.store, engine: s.engine, log: s.log}, opts...))
	ids := s.newIdentityService()
	mux.Handle(ids.handler(opts...))
	mux.Handle("GET /.well-known/", ids.authority.WellKnown(s.log))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("GET /dashboard/", dashboard())
	mux.Handle("GET /dashboard", http.RedirectHandler("/dashboard/", http.StatusMovedPermanently))
	// The E2B gateway calls the connect handlers above in this process,
	// each call with the caller's E2B key, through the same gate as any
	// other caller.
	gw := e2b.New(e2b.Config{APIURL: e2b.InProcessURL, HTTPClient: e2b.InProcess(mux), Domain: s.opts.E2BDomain, Logger: s.log}).Handler()
	for _, prefix := range e2b.Prefixes {
		mux.Handle(prefix, gw)
	}
	return handlers{api: identity.CallerMiddleware(s.identity.TrustDomain(), mux), e2b: gw}
}

func (s *Server) wakeGoldens() {
	select {
	case s.goldens <- struct{}{}:
	default:
	}
}

// idleSweepInterval is how often the control plane applies idle policies:
// an actor stops at most this long after its idle time ran out.
const idleSweepInterval = time.Second

// leaseInterval is how often the control plane ends the leases of E2B
// sandboxes that are over: a sandbox is killed or paused at most this
// long after its lease end.
const leaseInterval = time.Second

// restartSweepInterval is how often the control plane looks for actors
// whose restart after an exit is due: a restart comes at most this long
// after its back-off.
const restartSweepInterval = 250 * time.Millisecond

// RunBackground finishes what a previous control plane left in flight, then
// keeps watching until ctx is done: node heartbeats (lost nodes crash
// their actors), stale steps, idle actors, sandbox leases, golden builds
// and orphaned snapshot files. It returns once every loop it ran ended.
func (s *Server) RunBackground(ctx context.Context) {
	if err := s.engine.RequeueGoldens(ctx); err != nil {
		s.log.Error("requeue golden builds", "err", err)
	}
	if err := s.engine.Recover(ctx, 0); err != nil {
		s.log.Error("recover steps in flight", "err", err)
	}
	// Whoever stops RunBackground may close the store next: no loop may
	// outlive it.
	var loops sync.WaitGroup
	defer loops.Wait()
	every := func(period time.Duration, what string, fn func(context.Context) error) {
		loops.Go(func() { s.every(ctx, period, what, fn) })
	}
	every(s.opts.HeartbeatTimeout/3, "check nodes", s.engine.CheckNodes)
	every(s.opts.RecoverAfter/4, "recover steps in flight", func(ctx context.Context) error {
		return s.engine.Recover(ctx, s.opts.RecoverAfter)
	})
	every(time.Hour, "sweep orphaned snapshots", s.sweepOrphans)
	// Every replica sweeps: the steps' compare-and-set lets one act.
	every(idleSweepInterval, "apply idle policies", s.engine.SweepIdle)
	every(leaseInterval, "end sandbox leases", s.engine.EnforceLeases)
	every(restartSweepInterval, "restart exited actors", s.engine.RestartExited)
	every(time.Hour, "prune activity records", s.engine.PruneActivity)
	s.wakeGoldens()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		if err := s.engine.BuildGoldens(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("build golden snapshots", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.goldens:
		case <-tick.C:
		}
	}
}

func (s *Server) every(ctx context.Context, period time.Duration, what string, fn func(context.Context) error) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			s.log.Error(what, "err", err)
		}
	}
}

// sweepOrphans removes snapshot files no record points at (left by a
// crash between upload and commit); files younger than a day may belong
// to a checkpoint still in progress.
func (s *Server) sweepOrphans(ctx context.Context) error {
	removed, err := snapshot.SweepOrphans(ctx, s.objects, s.engine.LocationReferenced, 24*time.Hour)
	if len(removed) > 0 {
		s.log.Info("removed orphaned snapshots", "count", len(removed))
	}
	// Then the chunks no remaining snapshot names; node agents upload
	// meanwhile, so with the grace that makes that safe.
	chunks, cerr := snapshot.SweepChunks(ctx, s.objects, snapshot.ChunkGrace)
	if chunks > 0 {
		s.log.Info("removed unused snapshot chunks", "count", chunks)
	}
	return errors.Join(err, cerr)
}

type snapshotObjects struct{ store snapshot.ObjectStore }

func (o snapshotObjects) DeleteSnapshot(ctx context.Context, location string) error {
	return snapshot.DeleteSnapshot(ctx, o.store, location)
}
