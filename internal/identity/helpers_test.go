package identity

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// openStore opens url (one more replica's connection to it) until t ends.
func openStore(t *testing.T, ctx context.Context, url string) store.Store {
	t.Helper()
	st, err := store.Open(ctx, url)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// clock is a settable Config.Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Now()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

const testIssuer = "https://torpor.example:7070"

// newAuthority loads an Authority over a fresh store of backend.
func newAuthority(t *testing.T, backend string) (*Authority, *clock) {
	t.Helper()
	ctx := testContext(t)
	c := newClock()
	a, err := Load(ctx, openStore(t, ctx, storetest.URL(t, backend)), Config{Issuer: testIssuer, Now: c.Now})
	if err != nil {
		t.Fatalf("load authority: %v", err)
	}
	return a, c
}

func newCSR(t testing.TB) (crypto.Signer, []byte) {
	t.Helper()
	key, csr, err := NewCSR()
	if err != nil {
		t.Fatal(err)
	}
	return key, csr
}

// keypair certifies a new key with issue.
func keypair(t testing.TB, issue func(csr []byte) (*Issued, error)) *Keypair {
	t.Helper()
	key, csr := newCSR(t)
	issued, err := issue(csr)
	if err != nil {
		t.Fatalf("issue: %v", err)
	}
	cert, err := TLSCertificate(key, issued.Chain)
	if err != nil {
		t.Fatal(err)
	}
	return NewKeypair(cert)
}

// serveTLS serves h over TLS with cfg on a loopback port until t ends and
// returns its https URL. (httptest's StartTLS would install its own
// certificate next to cfg's GetCertificate.)
func serveTLS(t *testing.T, h http.Handler, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Refused handshakes are what some tests want: keep them out of the log.
	srv := &http.Server{Handler: h, TLSConfig: cfg, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return "https://" + ln.Addr().String()
}

func verify(t *testing.T, a *Authority, cert *x509.Certificate, usage x509.ExtKeyUsage) {
	t.Helper()
	if _, err := cert.Verify(x509.VerifyOptions{Roots: a.Roots(), KeyUsages: []x509.ExtKeyUsage{usage}, CurrentTime: a.cfg.Now()}); err != nil {
		t.Fatalf("certificate %v does not verify against the CA for %v: %v", cert.URIs, usage, err)
	}
}
