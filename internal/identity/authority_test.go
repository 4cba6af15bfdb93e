package identity

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/validate"
)

// TestCAIsSharedAndKept: replicas starting at once over one store get one
// CA and signing key, and a restarted server finds them again.
func TestCAIsSharedAndKept(t *testing.T) {
	for _, backend := range storetest.Backends {
		t.Run(backend, func(t *testing.T) {
			ctx := testContext(t)
			url := storetest.URL(t, backend)
			const replicas = 4
			loaded := make([]*Authority, replicas)
			errs := make([]error, replicas)
			var wg sync.WaitGroup
			for i := range replicas {
				st := openStore(t, ctx, url)
				wg.Go(func() { loaded[i], errs[i] = Load(ctx, st, Config{Issuer: testIssuer}) })
			}
			wg.Wait()
			for i := range replicas {
				if errs[i] != nil {
					t.Fatalf("replica %d: %v", i, errs[i])
				}
			}
			restarted, err := Load(ctx, openStore(t, ctx, url), Config{Issuer: testIssuer})
			if err != nil {
				t.Fatal(err)
			}
			for i, a := range append(loaded, restarted) {
				if !bytes.Equal(a.CACertificate().Raw, loaded[0].CACertificate().Raw) {
					t.Errorf("authority %d has another CA", i)
				}
				if !bytes.Equal(a.JWKS(), loaded[0].JWKS()) {
					t.Errorf("authority %d has another JWT key: %s vs %s", i, a.JWKS(), loaded[0].JWKS())
				}
			}
			// A certificate one replica issues verifies with another's roots.
			issued, err := loaded[1].IssueNodeCertificate("node-1", csrOf(t))
			if err != nil {
				t.Fatal(err)
			}
			verify(t, restarted, issued.Certificate, x509.ExtKeyUsageClientAuth)
		})
	}
}

func csrOf(t *testing.T) []byte {
	_, csr := newCSR(t)
	return csr
}

func TestCACertificate(t *testing.T) {
	a, _ := newAuthority(t, "sqlite")
	ca := a.CACertificate()
	if !ca.IsCA || !ca.MaxPathLenZero || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("CA: IsCA %v, MaxPathLenZero %v, key usage %b", ca.IsCA, ca.MaxPathLenZero, ca.KeyUsage)
	}
	if k, ok := ca.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("CA key is %T, want ECDSA P-256", ca.PublicKey)
	}
	if len(ca.URIs) != 1 || ca.URIs[0].String() != "spiffe://"+DefaultTrustDomain {
		t.Errorf("CA URIs = %v, want the trust domain", ca.URIs)
	}
	if got := a.CAFingerprint(); !strings.HasPrefix(got, "sha256:") || len(got) != len("sha256:")+64 {
		t.Errorf("CA fingerprint = %q", got)
	}
}

func TestIssuedCertificates(t *testing.T) {
	a, clk := newAuthority(t, "sqlite")
	now := clk.Now()
	worker := Workload{Space: "team-a", Actor: "web", ActorUID: "3f1c-uid"}
	cases := []struct {
		name     string
		issue    func(csr []byte) (*Issued, error)
		spiffeID string
		ttl      time.Duration
		usages   []x509.ExtKeyUsage
		check    func(t *testing.T, cert *x509.Certificate)
	}{
		{
			name:     "node",
			issue:    func(csr []byte) (*Issued, error) { return a.IssueNodeCertificate("node-7", csr) },
			spiffeID: "spiffe://torpor.local/node/node-7",
			ttl:      DefaultMemberCertTTL,
			usages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
			check: func(t *testing.T, cert *x509.Certificate) {
				if node, ok := NodeFromCertificate(cert, a.TrustDomain()); !ok || node != "node-7" {
					t.Errorf("NodeFromCertificate = %q, %v", node, ok)
				}
				if _, ok := NodeFromCertificate(cert, "other.domain"); ok {
					t.Error("a node certificate counts in another trust domain")
				}
			},
		},
		{
			name:     "workload",
			issue:    func(csr []byte) (*Issued, error) { return a.IssueWorkloadCertificate(worker, csr) },
			spiffeID: "spiffe://torpor.local/space/team-a/actor/web",
			ttl:      DefaultWorkloadCertTTL,
			usages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
			check: func(t *testing.T, cert *x509.Certificate) {
				got, err := WorkloadFromCertificate(cert, a.TrustDomain())
				if err != nil || got != worker {
					t.Errorf("WorkloadFromCertificate = %+v, %v; want %+v", got, err, worker)
				}
				if _, ok := NodeFromCertificate(cert, a.TrustDomain()); ok {
					t.Error("a workload certificate passes for a node certificate")
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The request asks for names of its own: they must be ignored.
			key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
				Subject: pkix.Name{CommonName: "admin"}, DNSNames: []string{"evil.example"},
				URIs: []*url.URL{{Scheme: "spiffe", Host: "torpor.local", Path: "/node/other"}},
			}, key)
			if err != nil {
				t.Fatal(err)
			}
			issued, err := tc.issue(csr)
			if err != nil {
				t.Fatal(err)
			}
			cert := issued.Certificate
			if len(cert.URIs) != 1 || cert.URIs[0].String() != tc.spiffeID || issued.SPIFFEID != tc.spiffeID {
				t.Errorf("URIs = %v (SPIFFEID %q), want exactly %s", cert.URIs, issued.SPIFFEID, tc.spiffeID)
			}
			if len(cert.DNSNames) != 0 || cert.Subject.CommonName == "admin" {
				t.Errorf("names from the request leaked in: DNS %v, CN %q", cert.DNSNames, cert.Subject.CommonName)
			}
			// X.509 keeps whole seconds.
			if want := now.Add(tc.ttl).Truncate(time.Second); !cert.NotAfter.Equal(want) {
				t.Errorf("expires %s, want %s (%s from now)", cert.NotAfter, want, tc.ttl)
			}
			if cert.NotBefore.After(now) {
				t.Errorf("not valid yet: NotBefore %s after now %s", cert.NotBefore, now)
			}
			if !key.PublicKey.Equal(cert.PublicKey) {
				t.Error("certificate is not for the requested key")
			}
			if len(issued.Chain) != 2 || !bytes.Equal(issued.Chain[0], cert.Raw) || !bytes.Equal(issued.Chain[1], a.CACertificate().Raw) {
				t.Error("chain is not the certificate followed by the CA")
			}
			for _, u := range tc.usages {
				verify(t, a, cert, u)
			}
			tc.check(t, cert)
		})
	}
}

func TestServerCertificate(t *testing.T) {
	a, clk := newAuthority(t, "sqlite")
	cert, err := a.ServerCertificate([]string{"torpor.example", "127.0.0.1", "::1"})
	if err != nil {
		t.Fatal(err)
	}
	leaf := cert.Leaf
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != ServerID(a.TrustDomain()) {
		t.Errorf("URIs = %v, want %s", leaf.URIs, ServerID(a.TrustDomain()))
	}
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "torpor.example" || len(leaf.IPAddresses) != 2 || !leaf.IPAddresses[1].Equal(net.IPv6loopback) {
		t.Errorf("DNS %v, IPs %v", leaf.DNSNames, leaf.IPAddresses)
	}
	if want := clk.Now().Add(DefaultServerCertTTL).Truncate(time.Second); !leaf.NotAfter.Equal(want) {
		t.Errorf("expires %s, want %s", leaf.NotAfter, want)
	}
	verify(t, a, leaf, x509.ExtKeyUsageServerAuth)
	if _, err := a.ServerCertificate([]string{""}); err == nil || !strings.Contains(err.Error(), "hosts[0]") {
		t.Errorf("empty host: err = %v, want one naming hosts[0]", err)
	}
}

func TestBadCertificateRequests(t *testing.T) {
	a, _ := newAuthority(t, "sqlite")
	request := func(key any) []byte {
		csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
		if err != nil {
			t.Fatal(err)
		}
		return csr
	}
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	rsa1024, _ := rsa.GenerateKey(rand.Reader, 1024)
	tampered := csrOf(t)
	tampered[len(tampered)-3] ^= 0xff // inside the signature
	cases := []struct {
		name    string
		csr     []byte
		mention string
	}{
		{"missing", nil, "required"},
		{"not DER", []byte("hello"), "not a DER PKCS#10"},
		{"signature broken", tampered, "signature"},
		{"curve P-224", request(p224), "P-224"},
		{"RSA 1024", request(rsa1024), "1024 bits"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for what, issue := range map[string]func([]byte) (*Issued, error){
				"node":     func(csr []byte) (*Issued, error) { return a.IssueNodeCertificate("node-1", csr) },
				"workload": func(csr []byte) (*Issued, error) { return a.IssueWorkloadCertificate(Workload{"s", "a", "u"}, csr) },
			} {
				_, err := issue(tc.csr)
				var fe *validate.FieldError
				if !errors.As(err, &fe) || fe.Path != "csr" || !strings.Contains(fe.Reason, tc.mention) {
					t.Errorf("%s: err = %v, want a csr field error mentioning %q", what, err, tc.mention)
				}
			}
		})
	}
}

func TestConfigRejectsBadTrustDomain(t *testing.T) {
	ctx := testContext(t)
	_, err := Load(ctx, openStore(t, ctx, storetest.URL(t, "sqlite")), Config{TrustDomain: "Torpor Prod/1"})
	if err == nil || !strings.Contains(err.Error(), "trust domain") {
		t.Fatalf("err = %v, want one naming the trust domain", err)
	}
}

func ExampleActorID() {
	fmt.Println(ActorID(DefaultTrustDomain, "team-a", "web"))
	fmt.Println(NodeID(DefaultTrustDomain, "node-1"))
	// Output:
	// spiffe://torpor.local/space/team-a/actor/web
	// spiffe://torpor.local/node/node-1
}
