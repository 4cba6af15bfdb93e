package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// EnvRouter names the router TCP tunnels go through when Tunnel.Router is
// empty.
const EnvRouter = "TORPOR_ROUTER"

// DefaultRouter is the router `torpor up` serves (--router-listen).
const DefaultRouter = "http://127.0.0.1:7080"

// DefaultDomain is the parent domain of actor host names a router serves
// by default (its --domain): *.localhost names resolve to the loopback.
const DefaultDomain = "actors.localhost"

// Tunnel opens TCP connections to actors' ports through a router (HTTP
// CONNECT; the protocol is in docs/operations.md, "TCP ports"), so no
// client needs a worker's address. Every connection resumes its actor if
// it is suspended and keeps it running while open.
type Tunnel struct {
	// Router is the router's base URL (http:// or https://). Default
	// $TORPOR_ROUTER, else DefaultRouter.
	Router string
	// Token is an API token for the actor's space; the router checks it
	// with the control plane on every connection.
	Token string
	// TLS configures an https:// router; nil verifies it with the system's
	// roots.
	TLS *tls.Config
}

// ErrTunnelRefused is wrapped by Dial's error when the router answered
// with a refusal (the message gives its status and words).
var ErrTunnelRefused = errors.New("the router refused the tunnel")

// Dial connects to port of actor space/name.
func (t Tunnel) Dial(ctx context.Context, space, name string, port int) (net.Conn, error) {
	if t.Token == "" {
		return nil, errors.New("a tunnel needs an API token (--token or $TORPOR_TOKEN; a client certificate from torpor login does not reach the router)")
	}
	routerURL := t.Router
	if routerURL == "" {
		routerURL = os.Getenv(EnvRouter)
	}
	if routerURL == "" {
		routerURL = DefaultRouter
	}
	u, err := url.Parse(routerURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("router %q: want an http:// or https:// URL", routerURL)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("router %s: %w", routerURL, err)
	}
	if u.Scheme == "https" {
		cfg := t.TLS.Clone()
		if cfg == nil {
			cfg = &tls.Config{}
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, fmt.Errorf("router %s: %w", routerURL, err)
		}
		conn = tc
	}
	tunneled, err := connectActor(ctx, conn, space, name, port, t.Token)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("tunnel to port %d of actor %s/%s through %s: %w", port, space, name, routerURL, err)
	}
	return tunneled, nil
}

// connectActor sends the CONNECT over conn and reads the answer. The
// actor is named by header, so the router's domain does not matter.
func connectActor(ctx context.Context, conn net.Conn, space, name string, port int, token string) (net.Conn, error) {
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d) //nolint:errcheck // a conn without deadlines fails the next call instead
		defer conn.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	authority := net.JoinHostPort(name+"."+space, strconv.Itoa(port))
	req := &http.Request{
		Method: http.MethodConnect, URL: &url.URL{Opaque: authority}, Host: authority,
		Header: http.Header{
			"Torpor-Actor":        {space + "/" + name},
			"Proxy-Authorization": {"Bearer " + token},
		},
	}
	if err := req.Write(conn); err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("%w: %s: %s", ErrTunnelRefused, resp.Status, strings.TrimSpace(string(body)))
	}
	if br.Buffered() == 0 {
		return conn, nil
	}
	return &readAhead{Conn: conn, r: br}, nil
}

// readAhead is a connection whose first bytes were read with the answer
// to the CONNECT.
type readAhead struct {
	net.Conn
	r *bufio.Reader
}

func (c *readAhead) Read(b []byte) (int, error) { return c.r.Read(b) }

// CloseWrite passes a half close on, so the actor sees the end of input.
func (c *readAhead) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
