package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
)

// replica is one control plane replica with its own store connections,
// serving the API over TLS as a production replica does (ServeAPI).
type replica struct {
	store  store.Store
	server *Server
	url    string
	roots  *x509.CertPool
	// adminToken is the installation's admin token.
	adminToken string
}

func startReplica(tb testing.TB, storeURL string, logs io.Writer) *replica {
	tb.Helper()
	// Templates may name pinnedImage (or anything else under /images),
	// which the server finds nothing at.
	images, err := image.NewPolicy(image.PolicyConfig{Dirs: []string{"/images"}})
	if err != nil {
		tb.Fatal(err)
	}
	return startReplicaWith(tb, storeURL, Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})), Images: images})
}

// startReplicaWith is startReplica with opts.
func startReplicaWith(tb testing.TB, storeURL string, opts Options) *replica {
	tb.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, storeURL)
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	tb.Cleanup(func() { st.Close() })
	objects, err := snapshot.NewDirStore(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	srv := New(st, objects, opts)
	a, err := srv.Authority(ctx)
	if err != nil {
		tb.Fatalf("load identity: %v", err)
	}
	token, err := srv.AdminToken(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return &replica{store: st, server: srv, url: serveAPI(tb, srv), roots: a.Roots(), adminToken: token}
}

// serveAPI runs srv.ServeAPI on a loopback port until tb ends.
func serveAPI(tb testing.TB, srv *Server) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeAPI(ctx, ln) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("serve API: %v", err)
		}
	})
	return "https://" + ln.Addr().String()
}

// serveTLS serves h on a loopback port until tb ends. (httptest's StartTLS
// would install its own certificate next to cfg's GetCertificate.)
func serveTLS(tb testing.TB, h http.Handler, cfg *tls.Config) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	// Refused handshakes are what some tests want: keep them out of the log.
	srv := &http.Server{Handler: h, TLSConfig: cfg, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	tb.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			tb.Errorf("serve: %v", err)
		}
	})
	return "https://" + ln.Addr().String()
}

// httpClient talks to the replica presenting cert (nil: none).
func (r *replica) httpClient(tb testing.TB, cert *identity.Keypair) *http.Client {
	return testClient(tb, r.roots, cert, "")
}

// admin talks to the replica with the admin token.
func (r *replica) admin(tb testing.TB) *http.Client {
	return testClient(tb, r.roots, nil, r.adminToken)
}

func (r *replica) identity(tb testing.TB, cert *identity.Keypair) torporv1connect.IdentityServiceClient {
	return torporv1connect.NewIdentityServiceClient(r.httpClient(tb, cert), r.url)
}

// joinNode gets a node certificate the way a node does: a token made
// through one replica, spent through another.
func joinNode(tb testing.TB, via, join *replica, node string) *identity.Keypair {
	tb.Helper()
	return joinMember(tb, via, join, &torporv1.CreateTokenRequest{Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_NODE_JOIN, Name: node})
}

// joinClient gets an API client's certificate with role and spaces.
func joinClient(tb testing.TB, r *replica, name string, role torporv1.ClientRole, spaces ...string) *identity.Keypair {
	tb.Helper()
	return joinMember(tb, r, r, &torporv1.CreateTokenRequest{Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_CLIENT_JOIN, Name: name, Role: role, Spaces: spaces})
}

// joinMember spends the token req describes, made through via, on a
// certificate through join.
func joinMember(tb testing.TB, via, join *replica, req *torporv1.CreateTokenRequest) *identity.Keypair {
	tb.Helper()
	ctx := context.Background()
	tok, err := torporv1connect.NewIdentityServiceClient(via.admin(tb), via.url).CreateToken(ctx, connect.NewRequest(req))
	if err != nil {
		tb.Fatalf("create join token: %v", err)
	}
	key, csr, err := identity.NewCSR()
	if err != nil {
		tb.Fatal(err)
	}
	issued, err := join.identity(tb, nil).Join(ctx, connect.NewRequest(&torporv1.JoinRequest{Token: tok.Msg.GetToken(), Name: req.GetName(), Csr: csr}))
	if err != nil {
		tb.Fatalf("join %s: %v", req.GetName(), err)
	}
	cert, err := identity.TLSCertificate(key, issued.Msg.GetCertificateChain())
	if err != nil {
		tb.Fatal(err)
	}
	return identity.NewKeypair(cert)
}
