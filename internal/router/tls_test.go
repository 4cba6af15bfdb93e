package router

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/torpor-dev/torpor/internal/httpserve"
)

// The router serves sandboxes over HTTPS with a certificate from the
// installation's CA: a client that trusts the CA reaches
// https://<port>-<id>.<domain> (as the E2B SDK does) and the router's own
// loopback address with the sandbox headers (E2B_SANDBOX_URL).
func TestSandboxOverHTTPS(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createSandbox("sb1", false)
	e.resume(key)
	tr := e.newRouter(Config{})
	ctx, cancel := context.WithCancel(context.Background())
	ingress, err := tr.IngressTLS(ctx)
	if err != nil {
		t.Fatalf("HTTPS certificate: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- httpserve.Serve(ctx, ln, tr, ingress.Config()) }()
	renewed := make(chan error, 1)
	go func() { renewed <- ingress.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		<-renewed
	})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.caPEM)
	addr := ln.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		// Every name under the domain is this router, as DNS would say.
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	t.Cleanup(client.CloseIdleConnections)
	for _, tc := range []struct {
		name    string
		url     string
		headers bool
	}{
		{"host", "https://" + net.JoinHostPort(strconv.Itoa(e.port)+"-sb1."+DefaultDomain, port) + "/a", false},
		{"loopback address and headers", "https://" + addr + "/a", true},
		{"localhost and headers", "https://" + net.JoinHostPort("localhost", port) + "/a", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, tc.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.headers {
				req.Header.Set(SandboxIDHeader, "sb1")
				req.Header.Set(SandboxPortHeader, strconv.Itoa(e.port))
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("GET %s: %v", tc.url, err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || string(b) != "hello from sb1 at /a" {
				t.Fatalf("GET %s: %d %q", tc.url, resp.StatusCode, b)
			}
		})
	}
}
