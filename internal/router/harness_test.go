package router

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/httpserve"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/server"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/testkit"
	"github.com/torpor-dev/torpor/internal/validate"
	"github.com/torpor-dev/torpor/internal/workflow"
)

const (
	testSpace   = "default"
	pinnedImage = "oci:/images/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// workload is what a fake worker serves for an actor: a real HTTP handler
// on the worker's loopback IP, so the router proxies real traffic. A nil
// workload runs nothing (nothing listens: connection refused).
type workload func(actor string) http.Handler

// env is a real control plane (API over SQLite, workflow engine) whose one
// node is a fake agent running workloads as loopback HTTP servers.
type env struct {
	t testing.TB
	// store is the control plane's, for states no call can hold still.
	store  store.Store
	apiURL string
	// apiClient calls the API with the admin token.
	apiClient *http.Client
	// caPEM is the installation's CA, for clients with other credentials.
	caPEM     []byte
	actors    torporv1connect.ActorServiceClient
	templates torporv1connect.TemplateServiceClient
	agent     *fakeAgent
	port      int
	// engine is the control plane's, which applies idle policies from the
	// activity the routers report (its sweep runs every 50ms).
	engine *workflow.Engine
	// sweptFrom is when the latest idle sweep that has ended began
	// (Unix nanoseconds).
	sweptFrom atomic.Int64
	// calls counts API calls by procedure, as the server received them.
	calls sync.Map // procedure -> *atomic.Int64
	// outages counts, by procedure, the calls still to be answered
	// Unavailable, as a control plane answers while its database restarts.
	outages sync.Map // procedure -> *atomic.Int64
}

// nextWorkerIP hands out distinct loopback addresses (all of 127/8 is
// loopback on Linux) so tests never share a worker address.
var nextWorkerIP atomic.Int32

func workerIP() string {
	n := nextWorkerIP.Add(1)
	return fmt.Sprintf("127.0.%d.%d", 1+n/250, 2+n%250)
}

// newEnv starts the control plane with `workers` fake workers, all serving
// wl.
func newEnv(t testing.TB, workers int, wl workload) *env {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	objects, err := snapshot.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Templates may name pinnedImage, which nothing reads: the workers
	// are fakes.
	images, err := image.NewPolicy(image.PolicyConfig{Dirs: []string{"/images"}})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, store: st, port: testkit.FreePort(t)}
	srv := server.New(st, objects, server.Options{Logger: slog.New(slog.DiscardHandler), HeartbeatTimeout: time.Hour, Images: images})
	api := srv.Handler()
	e.engine = srv.Engine()
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := e.calls.LoadOrStore(r.URL.Path, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if left, ok := e.outages.Load(r.URL.Path); ok && left.(*atomic.Int64).Add(-1) >= 0 {
			connect.NewErrorWriter().Write(w, r, connect.NewError(connect.CodeUnavailable, errors.New("the control plane cannot check credentials now, retry")))
			return
		}
		api.ServeHTTP(w, r)
	})
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveCtx, stopServing := context.WithCancel(ctx)
	tlsConfig, _, err := srv.TLSConfig(serveCtx, apiLn.Addr()) // not renewed: the test ends long before the certificate
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- httpserve.Serve(serveCtx, apiLn, counted, tlsConfig) }()
	ca, err := srv.Authority(ctx)
	if err != nil {
		t.Fatal(err)
	}
	adminToken, err := srv.AdminToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.apiURL = "https://" + apiLn.Addr().String()
	e.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.CACertificate().Raw})
	if e.apiClient, err = (client.Connection{Server: e.apiURL, CA: e.caPEM, Token: adminToken}).HTTPClient(); err != nil {
		t.Fatal(err)
	}

	// The fake agent serves as node-1, with its node certificate.
	key, csr, err := identity.NewCSR()
	if err != nil {
		t.Fatal(err)
	}
	issued, err := ca.IssueNodeCertificate("node-1", csr)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := identity.TLSCertificate(key, issued.Chain)
	if err != nil {
		t.Fatal(err)
	}
	nodeCert := identity.NewKeypair(cert)
	e.agent = newFakeAgent(t, e.port, wl)
	agentPath, agentHandler := torporv1connect.NewNodeAgentServiceHandler(e.agent)
	agentMux := http.NewServeMux()
	agentMux.Handle(agentPath, agentHandler)
	agentLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	agentSrv := &http.Server{Handler: agentMux, TLSConfig: identity.ServerTLSConfig(nodeCert, ca.Roots())}
	go agentSrv.ServeTLS(agentLn, "", "")
	sweepCtx, stopSweeping := context.WithCancel(ctx)
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sweepCtx.Done():
				return
			case <-tick.C:
			}
			began := time.Now()
			_ = e.engine.SweepIdle(sweepCtx)
			e.sweptFrom.Store(began.UnixNano())
		}
	}()
	t.Cleanup(func() {
		stopSweeping()
		<-swept
		stopServing()
		<-served
		agentSrv.Close()
		e.agent.stopAll()
		st.Close()
	})
	e.actors = torporv1connect.NewActorServiceClient(e.apiClient, e.apiURL)
	e.templates = torporv1connect.NewTemplateServiceClient(e.apiClient, e.apiURL)

	// A new store comes with the default space.
	if _, err := torporv1connect.NewSpaceServiceClient(e.apiClient, e.apiURL).GetSpace(ctx, connect.NewRequest(&torporv1.GetRequest{Name: testSpace})); err != nil {
		t.Fatalf("get space %s: %v", testSpace, err)
	}
	reg := &torporv1.RegisterNodeRequest{Node: &torporv1.Node{
		Metadata: &torporv1.ObjectMeta{Name: "node-1"}, Address: "https://" + agentLn.Addr().String(), SandboxClasses: []string{"gvisor"},
	}}
	for i := range workers {
		name, ip := fmt.Sprintf("w%d", i), workerIP()
		e.agent.workerIP[name] = ip
		reg.Workers = append(reg.Workers, &torporv1.Worker{
			Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: name},
			Spec:     &torporv1.WorkerSpec{Node: "node-1", Ip: ip, SandboxClass: "gvisor", Gate: e.agent.gateAddr},
		})
	}
	asNode := &http.Client{Transport: &http.Transport{TLSClientConfig: identity.ClientTLSConfig(nodeCert, ca.Roots(), ""), ForceAttemptHTTP2: true}}
	t.Cleanup(asNode.CloseIdleConnections)
	if _, err := torporv1connect.NewNodeServiceClient(asNode, e.apiURL).RegisterNode(ctx, connect.NewRequest(reg)); err != nil {
		t.Fatalf("register node: %v", err)
	}
	return e
}

// waitSweptAfter waits for the end of an idle sweep that began after
// after: one that stops an actor last active before after minus its idle
// period, unless it is busy.
func (e *env) waitSweptAfter(t testing.TB, after time.Time) {
	t.Helper()
	waitFor(t, "an idle sweep begun after "+after.Format(time.StampMilli), func() bool { return e.sweptFrom.Load() > after.UnixNano() })
}

// outage answers the next calls of procedure Unavailable.
func (e *env) outage(procedure string, calls int64) {
	n, _ := e.outages.LoadOrStore(procedure, new(atomic.Int64))
	n.(*atomic.Int64).Store(calls)
}

// callCount is how many calls of procedure the control plane received.
func (e *env) callCount(procedure string) int64 {
	n, ok := e.calls.Load(procedure)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// createActor creates a template with idle policy idle and a SUSPENDED
// actor on it.
func (e *env) createActor(name string, idle *torporv1.IdlePolicy) ActorKey {
	e.t.Helper()
	ctx := context.Background()
	if _, err := e.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: &torporv1.Template{
		Metadata: &torporv1.ObjectMeta{Space: testSpace, Name: "t-" + name},
		Spec: &torporv1.TemplateSpec{
			Containers: []*torporv1.Container{{Name: "app", Image: pinnedImage, Port: int32(e.port)}},
			IdlePolicy: idle,
		},
	}})); err != nil {
		e.t.Fatalf("create template: %v", err)
	}
	if _, err := e.actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: testSpace, Name: name},
		Spec:     &torporv1.ActorSpec{Template: "t-" + name},
	}})); err != nil {
		e.t.Fatalf("create actor: %v", err)
	}
	return ActorKey{Space: testSpace, Name: name}
}

func (e *env) state(key ActorKey) torporv1.ActorState {
	e.t.Helper()
	a, err := e.actors.GetActor(context.Background(), connect.NewRequest(&torporv1.GetRequest{Space: key.Space, Name: key.Name}))
	if err != nil {
		e.t.Fatalf("get actor %s: %v", key, err)
	}
	return a.Msg.GetStatus().GetState()
}

// waitState waits (bounded) for the actor to reach want.
func (e *env) waitState(key ActorKey, want torporv1.ActorState) {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := e.state(key)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("actor %s is %s, want %s", key, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testRouter is a router over e with its own registry, served on a real
// listener, its activity reports running.
type testRouter struct {
	*Router
	url string
	reg *prometheus.Registry
}

var routerNames atomic.Int32

// routerClient joins a router client (role router, of spaces or of every
// space) as torpor router does, and calls the API as it, over mutual TLS.
func (e *env) routerClient(spaces ...string) *http.Client {
	e.t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("router-%d", routerNames.Add(1))
	tok, err := torporv1connect.NewIdentityServiceClient(e.apiClient, e.apiURL).CreateToken(ctx, connect.NewRequest(&torporv1.CreateTokenRequest{
		Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_CLIENT_JOIN, Name: name, Role: torporv1.ClientRole_CLIENT_ROLE_ROUTER, Spaces: spaces,
	}))
	if err != nil {
		e.t.Fatalf("router join token: %v", err)
	}
	m := &identity.Member{
		Kind: identity.MemberClient, Name: name, ServerURL: e.apiURL, File: filepath.Join(e.t.TempDir(), "router-credentials.json"),
		CAFingerprint: tok.Msg.GetCaFingerprint(), JoinToken: func(context.Context) (string, error) { return tok.Msg.GetToken(), nil },
		Logger: slog.New(slog.DiscardHandler),
	}
	creds, err := m.Credentials(ctx)
	if err != nil {
		e.t.Fatalf("router %s joins: %v", name, err)
	}
	hc := creds.ControlPlaneClient()
	e.t.Cleanup(hc.CloseIdleConnections)
	return hc
}

func (e *env) newRouter(cfg Config) *testRouter {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Server = e.apiURL
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = e.routerClient()
	}
	cfg.Registerer = reg
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r, err := New(cfg)
	if err != nil {
		e.t.Fatalf("new router: %v", err)
	}
	srv := httptest.NewServer(r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			e.t.Errorf("router run: %v", err)
		}
	}()
	e.t.Cleanup(func() {
		srv.Close()
		cancel()
		<-done
	})
	return &testRouter{Router: r, url: srv.URL, reg: reg}
}

// request builds a request to the router for actor key at path.
func (tr *testRouter) request(t testing.TB, method string, key ActorKey, path string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, tr.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = key.Name + "." + key.Space + "." + DefaultDomain
	return req
}

// get sends GET path to the actor and returns status and body.
func (tr *testRouter) get(t testing.TB, key ActorKey, path string) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(tr.request(t, http.MethodGet, key, path, nil))
	if err != nil {
		t.Fatalf("GET %s for %s: %v", path, key, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp.StatusCode, string(b)
}

// metric returns the value of a counter or gauge (labels match exactly a
// subset), or the sample count of a histogram; 0 when absent.
func (tr *testRouter) metric(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := tr.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !labelsMatch(m.GetLabel(), labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

func labelsMatch(have []*dto.LabelPair, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range have {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// waitFor polls cond (bounded) and fails with what when it never holds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
