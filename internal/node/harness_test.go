package node

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// registry is a control plane reduced to what an agent calls: NodeService
// (it remembers registrations and counts heartbeats) and the node
// certificate calls of IdentityService, served over TLS with a real CA.
type registry struct {
	torporv1connect.UnimplementedNodeServiceHandler
	torporv1connect.UnimplementedIdentityServiceHandler
	mu         sync.Mutex
	nodes      map[string]*torporv1.RegisterNodeRequest
	heartbeats map[string]int
	// placements, when set, is the actor uid each worker hosts as far as
	// the control plane knows (answered as worker status).
	placements map[string]string

	url   string
	ca    *identity.Authority
	roots *x509.CertPool
	// serverCert is the control plane's certificate: it serves with it
	// and presents it to agents.
	serverCert *identity.Keypair
	// renewals counts RenewNodeCertificate calls.
	renewals atomic.Int64
}

func newRegistry(t testing.TB) *registry { return newRegistryWithCA(t, identity.Config{}) }

// newRegistryWithCA serves a registry whose CA has cfg.
func newRegistryWithCA(t testing.TB, cfg identity.Config) *registry {
	t.Helper()
	r := &registry{nodes: map[string]*torporv1.RegisterNodeRequest{}, heartbeats: map[string]int{}}
	st, err := store.Open(context.Background(), storetest.URL(t, "sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if r.ca, err = identity.Load(context.Background(), st, cfg); err != nil {
		t.Fatal(err)
	}
	r.roots = r.ca.Roots()
	cert, err := r.ca.ServerCertificate([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	r.serverCert = identity.NewKeypair(cert)
	mux := http.NewServeMux()
	mux.Handle(torporv1connect.NewNodeServiceHandler(r))
	mux.Handle(torporv1connect.NewIdentityServiceHandler(r))
	// Not httptest's StartTLS: it would answer clients that send no
	// server name (IP addresses) with a certificate of its own.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: identity.CallerMiddleware(r.ca.TrustDomain(), mux), TLSConfig: identity.ServerTLSConfig(r.serverCert, r.roots),
		ErrorLog: log.New(io.Discard, "", 0)}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	r.url = "https://" + ln.Addr().String()
	return r
}

// join lets cfg's node join r: its server, the CA to pin and a join token.
func (r *registry) join(t testing.TB, cfg *Config) {
	token := r.token(t, cfg.Name)
	cfg.ServerURL, cfg.CAFingerprint = r.url, r.ca.CAFingerprint()
	cfg.JoinToken = func(context.Context) (string, error) { return token, nil }
}

// token is a join token for node.
func (r *registry) token(t testing.TB, node string) string {
	t.Helper()
	tok, err := r.ca.CreateToken(context.Background(), identity.TokenRequest{Purpose: identity.PurposeNodeJoin, Name: node})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Secret
}

// client calls node's agent as the control plane does: presenting the
// server certificate and accepting only that node's.
func (r *registry) client(node string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:   identity.ClientTLSConfig(r.serverCert, r.roots, identity.NodeID(r.ca.TrustDomain(), node)),
		ForceAttemptHTTP2: true,
		// Tests stop and start agents on one address: no kept connection
		// may outlive its agent.
		DisableKeepAlives: true,
	}}
}

func (r *registry) Join(ctx context.Context, req *connect.Request[torporv1.JoinRequest]) (*connect.Response[torporv1.IssuedCertificate], error) {
	issued, err := r.ca.Join(ctx, req.Msg.GetToken(), req.Msg.GetName(), req.Msg.GetCsr())
	if errors.Is(err, identity.ErrInvalidToken) {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.IssuedCertificate{CertificateChain: issued.Chain, TrustBundle: r.ca.TrustBundle(), SpiffeId: issued.SPIFFEID}), nil
}

func (r *registry) RenewCertificate(ctx context.Context, req *connect.Request[torporv1.RenewCertificateRequest]) (*connect.Response[torporv1.IssuedCertificate], error) {
	node, ok := identity.CallerNode(ctx)
	if !ok {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("a node certificate is required"))
	}
	issued, err := r.ca.IssueNodeCertificate(node, req.Msg.GetCsr())
	if err != nil {
		return nil, err
	}
	r.renewals.Add(1)
	return connect.NewResponse(&torporv1.IssuedCertificate{CertificateChain: issued.Chain, TrustBundle: r.ca.TrustBundle(), SpiffeId: issued.SPIFFEID}), nil
}

func (r *registry) RegisterNode(_ context.Context, req *connect.Request[torporv1.RegisterNodeRequest]) (*connect.Response[torporv1.RegisterNodeResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := req.Msg.GetNode().GetMetadata().GetName()
	r.nodes[name] = proto.Clone(req.Msg).(*torporv1.RegisterNodeRequest)
	resp := &torporv1.RegisterNodeResponse{Node: req.Msg.GetNode()}
	for _, w := range req.Msg.GetWorkers() {
		w = proto.Clone(w).(*torporv1.Worker)
		w.Metadata.Uid = "uid-" + w.GetMetadata().GetName()
		if r.placements != nil {
			w.Status = &torporv1.WorkerStatus{}
			if uid := r.placements[w.GetMetadata().GetName()]; uid != "" {
				w.Status.Actor = &torporv1.ActorRef{Uid: uid}
			}
		}
		resp.Workers = append(resp.Workers, w)
	}
	return connect.NewResponse(resp), nil
}

func (r *registry) Heartbeat(_ context.Context, req *connect.Request[torporv1.HeartbeatRequest]) (*connect.Response[torporv1.HeartbeatResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes[req.Msg.GetNode()] == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("node "+req.Msg.GetNode()+" is not registered"))
	}
	r.heartbeats[req.Msg.GetNode()]++
	return connect.NewResponse(&torporv1.HeartbeatResponse{HeartbeatTime: timestamppb.Now()}), nil
}

// forget drops a node, as a control plane that lost its record (or gave
// up on the node) would, and sets the placements it answers with.
func (r *registry) forget(node string, placements map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.nodes, node)
	r.placements = placements
}

func (r *registry) registration(node string) *torporv1.RegisterNodeRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nodes[node]
}

// waitFor polls cond until it holds or a minute passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// running is an agent serving on a loopback port.
type running struct {
	agent  *Agent
	client torporv1connect.NodeAgentServiceClient
	// http reaches the agent as the control plane does.
	http *http.Client
	url  string
	stop func() error
}

// startAgent runs an agent for cfg (Listener and Logger filled in when
// unset) of the node joined to reg until the test ends or stop is called.
func startAgent(t testing.TB, reg *registry, cfg Config) *running {
	t.Helper()
	if cfg.Listener == nil {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listener = ln
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	t.Cleanup(func() { stop() })
	url := "https://" + cfg.Listener.Addr().String()
	hc := reg.client(cfg.Name)
	r := &running{agent: a, client: torporv1connect.NewNodeAgentServiceClient(hc, url), http: hc, url: url, stop: stop}
	waitFor(t, "the agent to serve", func() bool {
		select {
		case err := <-done:
			t.Fatalf("agent stopped: %v", err)
		default:
		}
		resp, err := hc.Get(url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return r
}

// testLogger logs to the test's output when -v is given.
func testLogger(t testing.TB) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func op(actorUID, opID, worker string) *torporv1.Operation {
	return &torporv1.Operation{ActorUid: actorUID, OperationId: opID, Worker: worker}
}

func wantCode(t testing.TB, err error, code connect.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("call succeeded, want %s", code)
	}
	if got := connect.CodeOf(err); got != code {
		t.Fatalf("error code %s (%v), want %s", got, err, code)
	}
}
