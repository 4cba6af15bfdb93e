package identity

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"strings"
	"testing"
)

// whoAmI answers with the calling node CallerMiddleware found, or "-".
func whoAmI(trustDomain string) http.Handler {
	return CallerMiddleware(trustDomain, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node, ok := CallerNode(r.Context())
		if !ok {
			node = "-"
		}
		io.WriteString(w, node)
	}))
}

// call GETs url over a client with cfg and returns the body and the
// server's certificate.
func call(t *testing.T, url string, cfg *tls.Config) (string, *x509.Certificate, error) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(url)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), resp.TLS.PeerCertificates[0], err
}

func TestCallerFromVerifiedCertificate(t *testing.T) {
	a, _ := newAuthority(t, "sqlite")
	stranger, _ := newAuthority(t, "sqlite") // another installation's CA
	server, err := a.ServerCertificate([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	url := serveTLS(t, whoAmI(a.TrustDomain()), ServerTLSConfig(NewKeypair(server), a.Roots()))

	nodeCert := func(a *Authority, node string) *Keypair {
		return keypair(t, func(csr []byte) (*Issued, error) { return a.IssueNodeCertificate(node, csr) })
	}
	cases := []struct {
		name   string
		cert   *Keypair
		caller string // "" when the handshake must fail
	}{
		{"node certificate", nodeCert(a, "node-1"), "node-1"},
		{"no certificate", nil, "-"},
		{"workload certificate", keypair(t, func(csr []byte) (*Issued, error) {
			return a.IssueWorkloadCertificate(Workload{"s", "node", "uid"}, csr)
		}), "-"},
		{"server certificate", NewKeypair(server), "-"},
		{"node certificate of another CA", nodeCert(stranger, "node-1"), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := call(t, url, ClientTLSConfig(tc.cert, a.Roots(), ""))
			switch {
			case tc.caller == "" && err == nil:
				t.Fatalf("handshake succeeded (caller %q), want it refused", got)
			case tc.caller != "" && err != nil:
				t.Fatal(err)
			case got != tc.caller && tc.caller != "":
				t.Errorf("caller = %q, want %q", got, tc.caller)
			}
		})
	}
}

func TestClientVerifiesServer(t *testing.T) {
	a, _ := newAuthority(t, "sqlite")
	// A node agent serving with its node certificate, reached by identity.
	node := keypair(t, func(csr []byte) (*Issued, error) { return a.IssueNodeCertificate("node-1", csr) })
	nodeURL := serveTLS(t, whoAmI(a.TrustDomain()), ServerTLSConfig(node, a.Roots()))
	server, err := a.ServerCertificate([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	serverKeys := NewKeypair(server)
	serverURL := serveTLS(t, whoAmI(a.TrustDomain()), ServerTLSConfig(serverKeys, a.Roots()))

	cases := []struct {
		name string
		url  string
		cfg  *tls.Config
		fail string
	}{
		{"node by its SPIFFE ID", nodeURL, ClientTLSConfig(nil, a.Roots(), NodeID(a.TrustDomain(), "node-1")), ""},
		{"node by another node's ID", nodeURL, ClientTLSConfig(nil, a.Roots(), NodeID(a.TrustDomain(), "node-2")), "want spiffe://torpor.local/node/node-2"},
		{"node by host name", nodeURL, ClientTLSConfig(nil, a.Roots(), ""), "127.0.0.1"},
		{"server by host name", serverURL, ClientTLSConfig(nil, a.Roots(), ""), ""},
		{"server by its SPIFFE ID", serverURL, ClientTLSConfig(nil, a.Roots(), ServerID(a.TrustDomain())), ""},
		{"server with the pinned CA", serverURL, BootstrapTLSConfig(a.CAFingerprint()), ""},
		{"node with the pinned CA", nodeURL, BootstrapTLSConfig(a.CAFingerprint()), "want spiffe://torpor.local/server"},
		{"server with another pin", serverURL, BootstrapTLSConfig("sha256:00"), "no CA with fingerprint"},
		{"server under unknown roots", serverURL, ClientTLSConfig(nil, x509.NewCertPool(), ""), "unknown authority"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := call(t, tc.url, tc.cfg)
			switch {
			case tc.fail == "" && err != nil:
				t.Fatal(err)
			case tc.fail != "" && (err == nil || !strings.Contains(err.Error(), tc.fail)):
				t.Fatalf("err = %v, want a failure mentioning %q", err, tc.fail)
			}
		})
	}

	t.Run("renewed certificate is served at once", func(t *testing.T) {
		renewed, err := a.ServerCertificate([]string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		serverKeys.Set(renewed)
		_, peer, err := call(t, serverURL, ClientTLSConfig(nil, a.Roots(), ""))
		if err != nil {
			t.Fatal(err)
		}
		if peer.SerialNumber.Cmp(renewed.Leaf.SerialNumber) != 0 {
			t.Errorf("server presented serial %s, want the renewed %s", peer.SerialNumber, renewed.Leaf.SerialNumber)
		}
	})
}
