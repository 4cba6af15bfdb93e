package server

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// A router gets its HTTPS certificate from the CA for the domains the
// control plane serves only; it names the actors' and sandboxes' hosts
// and the loopback names, verifies with the CA, and serves only.
func TestIssueIngressCertificate(t *testing.T) {
	ctx := context.Background()
	r := startReplicaWith(t, storetest.URL(t, "sqlite"), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), IngressDomains: []string{"actors.localhost", "Sandboxes.Example.COM."}})
	router := r.httpClient(t, joinClient(t, r, "edge", torporv1.ClientRole_CLIENT_ROLE_ROUTER, "a"))
	user := r.httpClient(t, joinClient(t, r, "user-a", torporv1.ClientRole_CLIENT_ROLE_USER, "a"))
	issue := func(hc *http.Client, domain string) (*torporv1.IssuedCertificate, error) {
		_, csr, err := identity.NewCSR()
		if err != nil {
			t.Fatal(err)
		}
		resp, err := torporv1connect.NewIdentityServiceClient(hc, r.url).IssueIngressCertificate(ctx, connect.NewRequest(&torporv1.IssueIngressCertificateRequest{Csr: csr, Domain: domain}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	for _, tc := range []struct {
		name   string
		caller *http.Client
		domain string
		code   connect.Code
		hosts  []string
	}{
		{"router", router, "actors.localhost", 0, []string{"49983-abc.actors.localhost", "actors.localhost", "localhost", "127.0.0.1", "::1"}},
		{"router, another configured domain", router, "sandboxes.example.com", 0, []string{"8000-x.sandboxes.example.com"}},
		{"admin", r.admin(t), "actors.localhost", 0, []string{"1-a.actors.localhost"}},
		{"a domain not served", router, "example.com", connect.CodeInvalidArgument, nil},
		{"a user client", user, "actors.localhost", connect.CodePermissionDenied, nil},
		{"no credentials", r.httpClient(t, nil), "actors.localhost", connect.CodeUnauthenticated, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			issued, err := issue(tc.caller, tc.domain)
			switch {
			case tc.code == 0 && err != nil:
				t.Fatalf("issue: %v", err)
			case tc.code != 0:
				if connect.CodeOf(err) != tc.code {
					t.Fatalf("got %v, want code %v", err, tc.code)
				}
				return
			}
			leaf, err := x509.ParseCertificate(issued.GetCertificateChain()[0])
			if err != nil {
				t.Fatal(err)
			}
			for _, host := range tc.hosts {
				if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: r.roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
					t.Errorf("certificate for %s: %v", host, err)
				}
			}
			for _, host := range []string{"app.default.actors.localhost", "example.com", "x.example.com"} {
				if leaf.VerifyHostname(host) == nil {
					t.Errorf("certificate for %v also names %s", leaf.DNSNames, host)
				}
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: r.roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
				t.Error("the certificate authenticates clients too")
			}
		})
	}
}
