package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/validate"
)

// bearer adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// testClient verifies the server against roots and presents cert (nil:
// none) and token (empty: none).
func testClient(tb testing.TB, roots *x509.CertPool, cert *identity.Keypair, token string) *http.Client {
	t := &http.Transport{TLSClientConfig: identity.ClientTLSConfig(cert, roots, ""), ForceAttemptHTTP2: true}
	tb.Cleanup(t.CloseIdleConnections)
	c := &http.Client{Transport: t}
	if token != "" {
		c.Transport = bearer{token, t}
	}
	return c
}

// apiToken makes an API token for spaces through the admin.
func (r *replica) apiToken(tb testing.TB, spaces ...string) string {
	tb.Helper()
	resp, err := torporv1connect.NewIdentityServiceClient(r.admin(tb), r.url).CreateToken(context.Background(), connect.NewRequest(&torporv1.CreateTokenRequest{
		Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_API, Spaces: spaces, Ttl: durationpb.New(time.Hour),
	}))
	if err != nil {
		tb.Fatalf("create API token for %v: %v", spaces, err)
	}
	return resp.Msg.GetToken()
}

// newTestServer is a server over a fresh SQLite store.
func newTestServer(tb testing.TB, opts Options) *Server {
	tb.Helper()
	st, err := store.Open(context.Background(), storetest.URL(tb, "sqlite"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	objects, err := snapshot.NewDirStore(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	opts.Logger = slog.New(slog.DiscardHandler)
	return New(st, objects, opts)
}

// TestEveryProcedureHasAnAccessRule keeps accessRules complete: a
// procedure without one would be refused to everyone.
func TestEveryProcedureHasAnAccessRule(t *testing.T) {
	count := 0
	protoregistry.GlobalFiles.RangeFilesByPackage("torpor.v1", func(f protoreflect.FileDescriptor) bool {
		for i := range f.Services().Len() {
			svc := f.Services().Get(i)
			if svc.FullName() == torporv1connect.NodeAgentServiceName {
				continue // served by node agents, not here
			}
			for _, m := range methods(string(svc.FullName())) {
				count++
				procedure := "/" + string(svc.FullName()) + "/" + string(m.Name())
				rule, ok := accessRules[procedure]
				if !ok {
					t.Errorf("%s has no access rule", procedure)
					continue
				}
				if rule != accessSpace {
					continue
				}
				// A space-scoped rule must find the space in the request.
				mt, err := protoregistry.GlobalTypes.FindMessageByName(m.Input().FullName())
				if err != nil {
					t.Fatal(err)
				}
				if _, named := requestSpace(mt.New().Interface()); !named {
					t.Errorf("%s is scoped by space, but its request %s names none", procedure, m.Input().FullName())
				}
			}
		}
		return true
	})
	if count < 30 {
		t.Fatalf("found %d procedures: the API's descriptors were not found", count)
	}
}

func TestRequestSpace(t *testing.T) {
	actor := &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "a", Name: "x"}}
	cases := []struct {
		name  string
		msg   any
		space string
		named bool
	}{
		{"get", &torporv1.GetRequest{Space: "a", Name: "x"}, "a", true},
		{"list of every space", &torporv1.ListRequest{}, "", true},
		{"delete", &torporv1.DeleteRequest{Space: "b"}, "b", true},
		{"resume", &torporv1.ResumeActorRequest{Space: "a", Name: "x"}, "a", true},
		{"create", &torporv1.CreateActorRequest{Actor: actor}, "a", true},
		{"create without object", &torporv1.CreateActorRequest{}, "", true},
		{"update", &torporv1.UpdateActorRequest{Actor: actor}, "a", true},
		{"create template", &torporv1.CreateTemplateRequest{Template: &torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "c"}}}, "c", true},
		{"heartbeat", &torporv1.HeartbeatRequest{Node: "n"}, "", false},
		{"not a message", "a", "", false},
	}
	for _, tc := range cases {
		space, named := requestSpace(tc.msg)
		if space != tc.space || named != tc.named {
			t.Errorf("%s: space %q named %v, want %q %v", tc.name, space, named, tc.space, tc.named)
		}
	}
}

// TestAPIAccess checks who may call what: no credential, a bad token, a
// token for space a (against space b and administration), a node
// certificate (against the API and other nodes) and the admin token.
func TestAPIAccess(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, storetest.URL(t, "sqlite"), io.Discard)
	admin := r.clients(r.admin(t))
	for _, space := range []string{"a", "b"} {
		if _, err := admin.spaces.CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: space}}})); err != nil {
			t.Fatal(err)
		}
		tmpl := counterTemplate("counter")
		tmpl.Metadata.Space = space
		if _, err := admin.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tmpl})); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
			Metadata: &torporv1.ObjectMeta{Space: space, Name: "x"}, Spec: &torporv1.ActorSpec{Template: "counter"},
		}})); err != nil {
			t.Fatal(err)
		}
	}
	nodeCert := joinNode(t, r, r, "node-1")
	otherNode := joinNode(t, r, r, "node-2")

	callers := map[string]clients{
		"anonymous":   r.clients(r.httpClient(t, nil)),
		"forged":      r.clients(testClient(t, r.roots, nil, "torpor-forged")),
		"not bearer":  r.clients(&http.Client{Transport: headerTransport{"Authorization", "Basic YTpi", r.httpClient(t, nil).Transport}}),
		"space a":     r.clients(testClient(t, r.roots, nil, r.apiToken(t, "a"))),
		"node-1":      r.clients(r.httpClient(t, nodeCert)),
		"admin":       admin,
		"spaces a, b": r.clients(testClient(t, r.roots, nil, r.apiToken(t, "a", "b"))),
		"router":      r.clients(r.httpClient(t, joinClient(t, r, "router", torporv1.ClientRole_CLIENT_ROLE_ROUTER))),
		"router of a": r.clients(r.httpClient(t, joinClient(t, r, "router-a", torporv1.ClientRole_CLIENT_ROLE_ROUTER, "a"))),
		"user of a":   r.clients(r.httpClient(t, joinClient(t, r, "user-a", torporv1.ClientRole_CLIENT_ROLE_USER, "a"))),
		"admin cert":  r.clients(r.httpClient(t, joinClient(t, r, "ops", torporv1.ClientRole_CLIENT_ROLE_ADMIN))),
	}
	type call func(c clients) error
	get := func(space string) call {
		return func(c clients) error {
			_, err := c.actors.GetActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: space, Name: "x"}))
			return err
		}
	}
	list := func(space string) call {
		return func(c clients) error {
			_, err := c.actors.ListActors(ctx, connect.NewRequest(&torporv1.ListRequest{Space: space}))
			return err
		}
	}
	update := func(space string) call {
		return func(c clients) error {
			_, err := c.actors.UpdateActor(ctx, connect.NewRequest(&torporv1.UpdateActorRequest{
				Actor:      &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: space, Name: "x"}, Spec: &torporv1.ActorSpec{WorkerSelector: map[string]string{"k": "v"}}},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.worker_selector"}},
			}))
			return err
		}
	}
	create := func(space string) call {
		return func(c clients) error {
			_, err := c.actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
				Metadata: &torporv1.ObjectMeta{Space: space, Name: "y-" + randomSuffix()}, Spec: &torporv1.ActorSpec{Template: "counter"},
			}}))
			return err
		}
	}
	// No worker is registered: a permitted resume fails for want of one.
	resume := func(space string) call {
		return func(c clients) error {
			_, err := c.actors.ResumeActor(ctx, connect.NewRequest(&torporv1.ResumeActorRequest{Space: space, Name: "x"}))
			return err
		}
	}
	deleteSnapshot := func(space string) call {
		return func(c clients) error {
			_, err := c.snapshots.DeleteSnapshot(ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: space, Name: "none"}))
			return err
		}
	}
	listSpaces := func(c clients) error {
		_, err := c.spaces.ListSpaces(ctx, connect.NewRequest(&torporv1.ListRequest{}))
		return err
	}
	getSpace := func(c clients) error {
		_, err := c.spaces.GetSpace(ctx, connect.NewRequest(&torporv1.GetRequest{Name: "a"}))
		return err
	}
	listWorkers := func(c clients) error {
		_, err := c.workers.ListWorkers(ctx, connect.NewRequest(&torporv1.ListRequest{Space: validate.WorkerNamespace}))
		return err
	}
	const (
		ok         = connect.Code(0)
		unauth     = connect.CodeUnauthenticated
		denied     = connect.CodePermissionDenied
		notFound   = connect.CodeNotFound
		noCapacity = connect.CodeResourceExhausted
	)
	cases := []struct {
		caller string
		what   string
		call   call
		code   connect.Code
	}{
		{"anonymous", "get", get("a"), unauth},
		{"anonymous", "list spaces", listSpaces, unauth},
		{"forged", "get", get("a"), unauth},
		{"not bearer", "get", get("a"), unauth},
		{"space a", "get in a", get("a"), ok},
		{"space a", "list a", list("a"), ok},
		{"space a", "update in a", update("a"), ok},
		{"space a", "create in a", create("a"), ok},
		{"space a", "resume in a", resume("a"), noCapacity},
		{"space a", "delete snapshot in a", deleteSnapshot("a"), notFound},
		{"space a", "get in b", get("b"), denied},
		{"space a", "list b", list("b"), denied},
		{"space a", "list every space", list(""), denied},
		{"space a", "update in b", update("b"), denied},
		{"space a", "create in b", create("b"), denied},
		{"space a", "resume in b", resume("b"), denied},
		{"space a", "delete snapshot in b", deleteSnapshot("b"), denied},
		{"space a", "get its space", getSpace, denied},
		{"space a", "list spaces", listSpaces, ok}, // its own only: below
		{"space a", "list workers", listWorkers, denied},
		{"spaces a, b", "get in b", get("b"), ok},
		{"spaces a, b", "list every space", list(""), denied},
		{"node-1", "get", get("a"), denied},
		{"node-1", "list workers", listWorkers, denied},
		{"router", "get in b", get("b"), ok},
		{"router", "resume in b", resume("b"), noCapacity},
		{"router", "list a", list("a"), denied},
		{"router", "update in a", update("a"), denied},
		{"router", "create in a", create("a"), denied},
		{"router", "delete snapshot in a", deleteSnapshot("a"), denied},
		{"router", "list spaces", listSpaces, denied},
		{"router", "list workers", listWorkers, denied},
		{"router of a", "get in a", get("a"), ok},
		{"router of a", "resume in a", resume("a"), noCapacity},
		{"router of a", "get in b", get("b"), denied},
		{"router of a", "resume in b", resume("b"), denied},
		{"user of a", "create in a", create("a"), ok},
		{"user of a", "list a", list("a"), ok},
		{"user of a", "get in b", get("b"), denied},
		{"user of a", "list spaces", listSpaces, ok},
		{"admin cert", "list every space", list(""), ok},
		{"admin cert", "list workers", listWorkers, ok},
		{"admin", "get in b", get("b"), ok},
		{"admin", "list every space", list(""), ok},
		{"admin", "list spaces", listSpaces, ok},
		{"admin", "list workers", listWorkers, ok},
	}
	// A token or client of some spaces lists those only (a tenant's
	// dashboard starts there).
	for caller, want := range map[string]string{"space a": "a", "user of a": "a", "spaces a, b": "a b"} {
		resp, err := callers[caller].spaces.ListSpaces(ctx, connect.NewRequest(&torporv1.ListRequest{}))
		if err != nil {
			t.Errorf("%s lists spaces: %v", caller, err)
			continue
		}
		var got []string
		for _, sp := range resp.Msg.GetSpaces() {
			got = append(got, sp.GetMetadata().GetName())
		}
		if strings.Join(got, " ") != want {
			t.Errorf("%s lists spaces %q, want %q", caller, got, want)
		}
	}
	for _, tc := range cases {
		t.Run(tc.caller+"/"+tc.what, func(t *testing.T) {
			err := tc.call(callers[tc.caller])
			if connect.CodeOf(err) != tc.code && !(tc.code == ok && err == nil) {
				t.Fatalf("%v, want %v", err, tc.code)
			}
			if tc.code == ok && err != nil {
				t.Fatalf("%v, want success", err)
			}
		})
	}

	// Nodes act only for themselves; the admin is no node.
	register := func(hc *http.Client, node string) error {
		_, err := torporv1connect.NewNodeServiceClient(hc, r.url).RegisterNode(ctx, connect.NewRequest(&torporv1.RegisterNodeRequest{Node: &torporv1.Node{
			Metadata: &torporv1.ObjectMeta{Name: node}, Address: "https://127.0.0.1:1", SandboxClasses: []string{"gvisor"},
		}}))
		return err
	}
	heartbeat := func(hc *http.Client, node string) error {
		_, err := torporv1connect.NewNodeServiceClient(hc, r.url).Heartbeat(ctx, connect.NewRequest(&torporv1.HeartbeatRequest{Node: node}))
		return err
	}
	if err := register(r.httpClient(t, nodeCert), "node-1"); err != nil {
		t.Fatalf("node-1 registers itself: %v", err)
	}
	if err := heartbeat(r.httpClient(t, nodeCert), "node-1"); err != nil {
		t.Fatalf("node-1 heartbeats for itself: %v", err)
	}
	for _, tc := range []struct {
		what string
		err  error
		code connect.Code
	}{
		{"node-2 registers as node-1", register(r.httpClient(t, otherNode), "node-1"), denied},
		{"node-2 heartbeats for node-1", heartbeat(r.httpClient(t, otherNode), "node-1"), denied},
		{"the admin registers node-1", register(r.admin(t), "node-1"), unauth},
		{"anonymous heartbeat", heartbeat(r.httpClient(t, nil), "node-1"), unauth},
		{"node-1 registers in the clear", func() error {
			_, err := torporv1connect.NewNodeServiceClient(r.httpClient(t, nodeCert), r.url).RegisterNode(ctx, connect.NewRequest(&torporv1.RegisterNodeRequest{Node: &torporv1.Node{
				Metadata: &torporv1.ObjectMeta{Name: "node-1"}, Address: "http://127.0.0.1:1",
			}}))
			return err
		}(), connect.CodeInvalidArgument},
	} {
		if connect.CodeOf(tc.err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.what, tc.err, tc.code)
		}
	}
	if n, err := torporv1connect.NewNodeServiceClient(r.admin(t), r.url).GetNode(ctx, connect.NewRequest(&torporv1.GetRequest{Name: "node-1"})); err != nil || n.Msg.GetAddress() != "https://127.0.0.1:1" {
		t.Errorf("node-1 after the refused calls: %v (%v), want its own registration", n, err)
	}
}

type headerTransport struct {
	key, value string
	next       http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.key, h.value)
	return h.next.RoundTrip(r)
}

var suffixes atomic.Int64

func randomSuffix() string { return strings.Repeat("z", int(suffixes.Add(1))) }

// TestServeAPIOverTLS: TLS 1.3 with HTTP/2, a certificate for the names
// clients use, and the open endpoints open.
func TestServeAPIOverTLS(t *testing.T) {
	ctx := context.Background()
	srv := newTestServer(t, Options{Listen: "127.0.0.1:0", TLSNames: []string{"torpor.example", "10.1.2.3"}})
	url := serveAPI(t, srv)
	a, err := srv.Authority(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hc := testClient(t, a.Roots(), nil, "")
	for _, path := range []string{"/healthz", "/.well-known/jwks.json"} {
		resp, err := hc.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 || resp.TLS.Version != tls.VersionTLS13 {
			t.Errorf("GET %s: %s over %s, TLS %x; want 200 over HTTP/2 and TLS 1.3", path, resp.Status, resp.Proto, resp.TLS.Version)
		}
		leaf := resp.TLS.PeerCertificates[0]
		if !slices.Equal(leaf.DNSNames, []string{"localhost", "torpor.example"}) || len(leaf.IPAddresses) != 2 ||
			len(leaf.URIs) != 1 || leaf.URIs[0].String() != identity.ServerID(identity.DefaultTrustDomain) {
			t.Errorf("server certificate names %v %v %v", leaf.DNSNames, leaf.IPAddresses, leaf.URIs)
		}
	}
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: identity.ClientTLSConfig(nil, a.Roots(), "")}}
	resp, err := h1.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 1 {
		t.Errorf("a client without HTTP/2 got %s", resp.Proto)
	}
}

// TestClientFiles: the admin token (private) and the CA land where the
// options say, and are what the server uses.
func TestClientFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv := newTestServer(t, Options{AdminTokenFile: filepath.Join(dir, "sub", "admin-token"), CAFile: filepath.Join(dir, "ca.pem")})
	for range 2 { // a restart writes them again
		if err := srv.WriteClientFiles(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "sub", "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("admin token file mode %v, want 0600", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(filepath.Join(dir, "sub", "admin-token"))
	token, _ := srv.AdminToken(ctx)
	if strings.TrimSpace(string(data)) != token || !strings.HasPrefix(token, "torpor-admin-") {
		t.Errorf("admin token file holds %q, the server's token is %q", data, token)
	}
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	block, _ := pem.Decode(caPEM)
	a, _ := srv.Authority(ctx)
	if block == nil || string(block.Bytes) != string(a.CACertificate().Raw) {
		t.Errorf("CA file does not hold the CA certificate:\n%s", caPEM)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("data directory holds %d entries, want 2 (no temporary files left)", len(entries))
	}
}

// TestControlPlaneVerifiesTheNodeAgent: a node agent must present its own
// node's certificate; an agent with another node's certificate is not
// called at all.
func TestControlPlaneVerifiesTheNodeAgent(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, storetest.URL(t, "sqlite"), io.Discard)
	node1, node2 := joinNode(t, r, r, "node-1"), joinNode(t, r, r, "node-2")
	agent := &mintingAgent{identity: r.identity(t, node1), workers: map[string]*torporv1.Worker{}}
	var calls atomic.Int64
	mux := http.NewServeMux()
	path, h := torporv1connect.NewNodeAgentServiceHandler(agent)
	mux.Handle(path, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		calls.Add(1)
		h.ServeHTTP(w, req)
	}))
	// node-1 registers an agent that presents node-2's certificate.
	impostor := serveTLS(t, mux, identity.ServerTLSConfig(node2, r.roots))
	reg := &torporv1.RegisterNodeRequest{
		Node: &torporv1.Node{Metadata: &torporv1.ObjectMeta{Name: "node-1"}, Address: impostor, SandboxClasses: []string{"gvisor"}},
		Workers: []*torporv1.Worker{{
			Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: "w0"},
			Spec:     &torporv1.WorkerSpec{Node: "node-1", Ip: "10.0.0.2", SandboxClass: "gvisor"},
		}},
	}
	resp, err := torporv1connect.NewNodeServiceClient(r.httpClient(t, node1), r.url).RegisterNode(ctx, connect.NewRequest(reg))
	if err != nil {
		t.Fatal(err)
	}
	agent.workers["w0"] = resp.Msg.GetWorkers()[0]
	admin := r.clients(r.admin(t))
	if _, err := admin.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: counterTemplate("counter")})); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "x"}, Spec: &torporv1.ActorSpec{Template: "counter"},
	}})); err != nil {
		t.Fatal(err)
	}
	_, err = admin.actors.ResumeActor(ctx, connect.NewRequest(&torporv1.ResumeActorRequest{Space: "default", Name: "x"}))
	if err == nil || !strings.Contains(err.Error(), identity.NodeID(identity.DefaultTrustDomain, "node-1")) {
		t.Fatalf("resume on the impostor: %v, want a refusal naming the expected identity", err)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the impostor was called %d times", n)
	}

	// The same agent with node-1's certificate is called.
	genuine := serveTLS(t, mux, identity.ServerTLSConfig(node1, r.roots))
	reg.Node.Address = genuine
	if _, err := torporv1connect.NewNodeServiceClient(r.httpClient(t, node1), r.url).RegisterNode(ctx, connect.NewRequest(reg)); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.actors.ResumeActor(ctx, connect.NewRequest(&torporv1.ResumeActorRequest{Space: "default", Name: "x"})); err != nil {
		t.Fatalf("resume on the genuine agent: %v", err)
	}
	if calls.Load() == 0 || agent.minted.Load() != 1 {
		t.Fatalf("the genuine agent was called %d times and minted %d certificates", calls.Load(), agent.minted.Load())
	}
}

// TestClientCertificateLifecycle: a client renews its certificate; an
// admin lists clients and tokens, revokes a token before use, and deletes
// a client, whose certificates fail from the next call on, on every
// replica.
func TestClientCertificateLifecycle(t *testing.T) {
	ctx := context.Background()
	url := storetest.URL(t, "postgres")
	a, b := startReplica(t, url, io.Discard), startReplica(t, url, io.Discard)
	admin := torporv1connect.NewIdentityServiceClient(a.admin(t), a.url)
	cert := joinClient(t, a, "edge", torporv1.ClientRole_CLIENT_ROLE_ROUTER, "a")
	viaB := b.clients(b.httpClient(t, cert))
	get := func() error {
		_, err := viaB.actors.GetActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "a", Name: "x"}))
		return err
	}
	if err := get(); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("router client gets an actor: %v, want not found", err)
	}

	_, csr := mustCSR(t)
	renewed, err := b.identity(t, cert).RenewCertificate(ctx, connect.NewRequest(&torporv1.RenewCertificateRequest{Csr: csr}))
	if err != nil || renewed.Msg.GetSpiffeId() != identity.ClientID(identity.DefaultTrustDomain, "edge") {
		t.Fatalf("renew: %v (%v)", renewed, err)
	}

	clients, err := admin.ListClients(ctx, connect.NewRequest(&torporv1.ListClientsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if got := clients.Msg.GetClients(); len(got) != 1 || got[0].GetName() != "edge" || got[0].GetRole() != torporv1.ClientRole_CLIENT_ROLE_ROUTER || !slices.Equal(got[0].GetSpaces(), []string{"a"}) {
		t.Errorf("clients %v", got)
	}

	unused, err := admin.CreateToken(ctx, connect.NewRequest(&torporv1.CreateTokenRequest{
		Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_CLIENT_JOIN, Name: "late", Role: torporv1.ClientRole_CLIENT_ROLE_USER, Spaces: []string{"a"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := admin.ListTokens(ctx, connect.NewRequest(&torporv1.ListTokensRequest{}))
	if err != nil || len(tokens.Msg.GetTokens()) != 1 || tokens.Msg.GetTokens()[0].GetId() != unused.Msg.GetId() || tokens.Msg.GetTokens()[0].GetRole() != torporv1.ClientRole_CLIENT_ROLE_USER {
		t.Fatalf("tokens %v (%v), want only the unused one", tokens, err)
	}
	if _, err := admin.RevokeToken(ctx, connect.NewRequest(&torporv1.RevokeTokenRequest{Id: unused.Msg.GetId()[:12]})); err != nil {
		t.Fatal(err)
	}
	_, jcsr := mustCSR(t)
	_, err = b.identity(t, nil).Join(ctx, connect.NewRequest(&torporv1.JoinRequest{Token: unused.Msg.GetToken(), Name: "late", Csr: jcsr}))
	wantCode(t, err, connect.CodeUnauthenticated, "invalid, expired or already used")
	_, err = admin.RevokeToken(ctx, connect.NewRequest(&torporv1.RevokeTokenRequest{Id: unused.Msg.GetId()}))
	wantCode(t, err, connect.CodeNotFound, "torpor token list")

	_, err = torporv1connect.NewIdentityServiceClient(b.httpClient(t, cert), b.url).DeleteClient(ctx, connect.NewRequest(&torporv1.DeleteClientRequest{Name: "edge"}))
	wantCode(t, err, connect.CodePermissionDenied, "only an admin")
	if _, err := admin.DeleteClient(ctx, connect.NewRequest(&torporv1.DeleteClientRequest{Name: "edge"})); err != nil {
		t.Fatal(err)
	}
	wantCode(t, get(), connect.CodeUnauthenticated, "join with a new token")
	_, err = b.identity(t, cert).RenewCertificate(ctx, connect.NewRequest(&torporv1.RenewCertificateRequest{Csr: csr}))
	wantCode(t, err, connect.CodeUnauthenticated, "join with a new token")
	_, err = admin.DeleteClient(ctx, connect.NewRequest(&torporv1.DeleteClientRequest{Name: "edge"}))
	wantCode(t, err, connect.CodeNotFound, "edge")
}
