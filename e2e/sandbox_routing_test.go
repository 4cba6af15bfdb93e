package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/envd"
	"github.com/torpor-dev/torpor/internal/httpserve"
	"github.com/torpor-dev/torpor/internal/router"
)

// TestSandboxRouting: a sandbox on gVisor is reached through the router
// the ways the E2B SDK reaches it: https://<port>-<id>.<domain> with the
// router's certificate from the installation's CA, and the router's own
// address with the E2b-Sandbox-Id and E2b-Sandbox-Port headers; any port
// (the workload's, and the in-sandbox API's, 49983). Paused, it answers
// 502 and stays paused; connected again it answers; killed, it is 502 not
// found.
func TestSandboxRouting(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	sandboxes := torporv1connect.NewSandboxServiceClient(c.e2bClient("default"), c.api)
	created, err := sandboxes.CreateSandbox(c.ctx, connect.NewRequest(&torporv1.CreateSandboxRequest{Space: "default", Template: "counter", TimeoutSeconds: 300, Secure: true}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.Msg.GetMetadata().GetName()

	// The router's HTTPS listener, as torpor router --tls-listen serves it.
	ctx, cancel := context.WithCancel(c.ctx)
	ingress, err := c.router.IngressTLS(ctx)
	if err != nil {
		t.Fatalf("the router's HTTPS certificate: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- httpserve.Serve(ctx, ln, c.router, ingress.Config()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve HTTPS: %v", err)
		}
	})
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(c.conn.CA) {
		t.Fatal("no CA certificate")
	}
	tlsAddr := ln.Addr().String()
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)
	httpsClient := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		// Every name under the domain is the router, as a wildcard DNS
		// record (or *.localhost) says.
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, tlsAddr)
		},
	}}
	t.Cleanup(httpsClient.CloseIdleConnections)

	type way struct {
		name string
		do   func(port int, path string) (*http.Response, error)
	}
	ways := []way{
		{"https host", func(port int, path string) (*http.Response, error) {
			return httpsClient.Get("https://" + net.JoinHostPort(fmt.Sprintf("%d-%s.%s", port, id, router.DefaultDomain), tlsPort) + path)
		}},
		{"https headers", func(port int, path string) (*http.Response, error) {
			req, err := http.NewRequest(http.MethodGet, "https://"+tlsAddr+path, nil)
			if err != nil {
				return nil, err
			}
			req.Header.Set(router.SandboxIDHeader, id)
			req.Header.Set(router.SandboxPortHeader, strconv.Itoa(port))
			return httpsClient.Do(req)
		}},
		{"http host", func(port int, path string) (*http.Response, error) {
			req, err := http.NewRequest(http.MethodGet, c.ingress+path, nil)
			if err != nil {
				return nil, err
			}
			req.Host = fmt.Sprintf("%d-%s.%s", port, id, router.DefaultDomain)
			return http.DefaultClient.Do(req)
		}},
	}
	answer := func(w way, port int, path string) (int, string) {
		t.Helper()
		resp, err := w.do(port, path)
		if err != nil {
			t.Fatalf("%s, port %d: %v", w.name, port, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	wantRunning := func(when string) {
		t.Helper()
		for _, w := range ways {
			if status, body := answer(w, 8080, "/"); status != http.StatusOK || body == "" {
				t.Errorf("%s, %s, the workload's port: %d %q", when, w.name, status, body)
			}
			if status, body := answer(w, envd.Port, "/health"); status/100 != 2 {
				t.Errorf("%s, %s, the in-sandbox API's /health: %d %q", when, w.name, status, body)
			}
		}
	}
	want502 := func(when, says string) {
		t.Helper()
		for _, w := range ways {
			status, body := answer(w, envd.Port, "/health")
			var msg struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal([]byte(body), &msg); err != nil || status != http.StatusBadGateway || msg.Code != http.StatusBadGateway ||
				!strings.Contains(msg.Message, "sandbox "+id) || !strings.Contains(msg.Message, says) {
				t.Errorf("%s, %s: %d %q, want 502 saying %q", when, w.name, status, body, says)
			}
		}
	}

	wantRunning("created")
	c.suspend(id) // what E2B's pause is
	want502("paused", "is not running (paused")
	if st := c.actor(id).GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("traffic woke the paused sandbox: it is %s", st)
	}
	if _, err := sandboxes.ConnectSandbox(c.ctx, connect.NewRequest(&torporv1.ConnectSandboxRequest{Space: "default", SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	wantRunning("connected")
	if _, err := c.actors.DeleteActor(c.ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: "default", Name: id, Force: true})); err != nil {
		t.Fatal(err)
	}
	c.waitFor("sandbox "+id+" to be gone", func() bool {
		_, err := c.actors.GetActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: id}))
		return connect.CodeOf(err) == connect.CodeNotFound
	})
	want502("killed", "not found")
}
