package router

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/httpserve"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// apiToken makes an API token for spaces, as an admin does.
func (e *env) apiToken(spaces ...string) string {
	e.t.Helper()
	ctx := context.Background()
	for _, s := range spaces {
		_, err := torporv1connect.NewSpaceServiceClient(e.apiClient, e.apiURL).CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{
			Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: s}},
		}))
		if err != nil && connect.CodeOf(err) != connect.CodeAlreadyExists {
			e.t.Fatalf("create space %s: %v", s, err)
		}
	}
	resp, err := torporv1connect.NewIdentityServiceClient(e.apiClient, e.apiURL).CreateToken(ctx, connect.NewRequest(&torporv1.CreateTokenRequest{
		Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_API, Spaces: spaces,
	}))
	if err != nil {
		e.t.Fatalf("API token for %v: %v", spaces, err)
	}
	return resp.Msg.GetToken()
}

// connectTunnel sends CONNECT authority with the given headers to the
// router and returns the response and, on 200, the tunnel.
func (tr *testRouter) connectTunnel(t testing.TB, authority string, header http.Header) (*http.Response, net.Conn) {
	t.Helper()
	u, err := url.Parse(tr.url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: authority}, Host: authority, Header: header}
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatalf("CONNECT %s: %v", authority, err)
	}
	if resp.StatusCode != http.StatusOK {
		conn.Close()
		return resp, nil
	}
	return resp, &bufferedConn{Conn: conn, r: br}
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// TestTunnelReachesTheActorsPortAndResumesIt: a CONNECT with a token of
// the actor's space resumes the suspended actor and relays a whole HTTP
// exchange with its workload; the open tunnel keeps the actor in flight.
func TestTunnelReachesTheActorsPortAndResumesIt(t *testing.T) {
	e := newEnv(t, 1, func(actor string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "hello from %s", actor) })
	})
	key := e.createActor("tcp", &torporv1.IdlePolicy{Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND, IdleSeconds: 1})
	tr := e.newRouter(Config{})
	token := e.apiToken(testSpace)
	authority := fmt.Sprintf("tcp.default.%s:%d", DefaultDomain, e.port)

	for _, header := range []http.Header{
		{"Proxy-Authorization": {"Bearer " + token}},
		{"Proxy-Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("token:"+token))}},
	} {
		resp, conn := tr.connectTunnel(t, authority, header)
		opened := time.Now()
		if conn == nil {
			body, _ := io.ReadAll(resp.Body)
			t.Fatalf("CONNECT %s: %s %s", authority, resp.Status, body)
		}
		if got := e.state(key); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
			t.Fatalf("actor %s is %s after the tunnel opened, want RUNNING", key, got)
		}
		// A sweep past the idle period since the actor's last activity
		// but the tunnel: the open tunnel keeps the actor.
		e.waitSweptAfter(t, opened.Add(time.Second))
		if got := e.state(key); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
			t.Fatalf("actor %s is %s with a tunnel open, want RUNNING", key, got)
		}
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		got, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("HTTP over the tunnel: %v", err)
		}
		body, _ := io.ReadAll(got.Body)
		conn.Close()
		if string(body) != "hello from tcp" {
			t.Fatalf("over the tunnel: %q", body)
		}
		e.waitState(key, torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	}
}

// TestTunnelRefusals: every tunnel is checked with the control plane
// for the token it carries.
func TestTunnelRefusals(t *testing.T) {
	e := newEnv(t, 1, func(string) http.Handler { return http.NotFoundHandler() })
	key := e.createActor("tcp", nil)
	tr := e.newRouter(Config{})
	own, other := e.apiToken(testSpace), e.apiToken("other")
	authority := fmt.Sprintf("tcp.default.%s:%d", DefaultDomain, e.port)
	for _, tc := range []struct {
		name      string
		authority string
		header    http.Header
		status    int
		says      string
	}{
		{"no token", authority, http.Header{}, http.StatusProxyAuthRequired, "needs an API token"},
		{"invalid token", authority, http.Header{"Proxy-Authorization": {"Bearer nope"}}, http.StatusProxyAuthRequired, "invalid or expired"},
		{"token of another space", authority, http.Header{"Proxy-Authorization": {"Bearer " + other}}, http.StatusForbidden, "no access to actor default/tcp"},
		{"no port", "tcp.default." + DefaultDomain, http.Header{"Proxy-Authorization": {"Bearer " + own}}, http.StatusBadRequest, "must name the actor's port"},
		{"unknown actor", fmt.Sprintf("nobody.default.%s:%d", DefaultDomain, e.port), http.Header{"Proxy-Authorization": {"Bearer " + own}}, http.StatusNotFound, "not found"},
		{"closed port", fmt.Sprintf("tcp.default.%s:%d", DefaultDomain, testkit.FreePort(t)), http.Header{"Proxy-Authorization": {"Bearer " + own}}, http.StatusBadGateway, "nothing listens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, conn := tr.connectTunnel(t, tc.authority, tc.header)
			if conn != nil {
				conn.Close()
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.says) {
				t.Errorf("%s %q, want %d saying %q", resp.Status, body, tc.status, tc.says)
			}
		})
	}
	if got := e.state(key); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Errorf("actor %s is %s: only the closed port's tunnel, which got past the checks, resumes it", key, got)
	}
}

// TestTunnelOverHTTP2: a CONNECT on an HTTP/2 stream (the router serves
// cleartext HTTP/2 as well) relays the same way, the stream's bodies
// carrying the bytes.
func TestTunnelOverHTTP2(t *testing.T) {
	e := newEnv(t, 1, func(actor string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "hello from %s", actor) })
	})
	e.createActor("h2", nil)
	tr := e.newRouter(Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- httpserve.Serve(ctx, ln, tr.Router, nil) }()
	defer func() { stop(); <-served }()

	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	h2 := &http.Client{Transport: &http.Transport{Protocols: protocols}}
	defer h2.CloseIdleConnections()
	authority := fmt.Sprintf("h2.default.%s:%d", DefaultDomain, e.port)
	up, upWriter := io.Pipe()
	req, err := http.NewRequest(http.MethodConnect, "http://"+ln.Addr().String(), up)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = authority
	req.Header.Set("Proxy-Authorization", "Bearer "+e.apiToken(testSpace))
	resp, err := h2.Do(req)
	if err != nil {
		t.Fatalf("CONNECT over HTTP/2: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("CONNECT over HTTP/2: %s (HTTP/%d) %s", resp.Status, resp.ProtoMajor, b)
	}
	fmt.Fprintf(upWriter, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	got, err := http.ReadResponse(bufio.NewReader(resp.Body), nil)
	if err != nil {
		t.Fatalf("HTTP over the HTTP/2 tunnel: %v", err)
	}
	body, _ := io.ReadAll(got.Body)
	upWriter.Close()
	if string(body) != "hello from h2" {
		t.Fatalf("over the HTTP/2 tunnel: %q", body)
	}
}
