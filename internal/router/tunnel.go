package router

// TCP tunnels: any TCP port of an actor, through the router's own port, so
// clients never need a worker's address (which belongs to the slot, not
// the actor, and which only the node's host can reach). A client opens a
// tunnel with HTTP CONNECT, the way it would through any HTTP proxy:
//
//	CONNECT <actor>.<space>.<domain>:<port> HTTP/1.1
//	Host: <actor>.<space>.<domain>:<port>
//	Proxy-Authorization: Bearer <API token>
//
// (or Basic with the token as the password, for clients that speak only
// Basic, such as socat and curl's --proxy-user; the Torpor-Actor header
// names the actor instead of the host, as for requests). The router checks
// the token with the control plane for the actor's space, resumes the
// actor if it is not running, connects to the port on its current worker,
// answers 200 and then relays bytes both ways until either side closes.
// An open tunnel counts as a request in flight: the idle policy leaves the
// actor running while it is open. A suspend (by API or eviction) closes
// it: connections do not survive a checkpoint.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

var (
	// errNoCredential: a tunnel without a token.
	errNoCredential = errors.New("a tunnel needs an API token for the actor's space (Proxy-Authorization: Bearer <token>, or Basic with the token as password)")
	errNoPort       = errors.New("CONNECT must name the actor's port: <actor>.<space>.<domain>:<port>")
	// errPortClosed: nothing accepted the connection on the actor's port.
	errPortClosed = errors.New("nothing listens on that port of the actor")
)

// serveTunnel serves a CONNECT request for key.
func (r *Router) serveTunnel(w *recorder, req *http.Request, key ActorKey, start time.Time, resumed *time.Duration) {
	ctx := req.Context()
	port, err := tunnelPort(req.Host)
	if err != nil {
		w.answer(http.StatusBadRequest, err.Error(), err)
		return
	}
	if err := r.authorizeTunnel(ctx, req, key); err != nil {
		r.refuseTunnel(w, req, key, err)
		return
	}
	if r.actors.enter(key, start) {
		r.syncReport(ctx, key)
	}
	defer func() { r.actors.leave(key, time.Now()) }()

	backend, err := r.dialActor(ctx, key, port, resumed)
	if errors.Is(err, errPortClosed) {
		w.answer(http.StatusBadGateway, fmt.Sprintf("actor %s: %v", key, errPortClosed), err)
		return
	}
	if err != nil {
		r.writeError(w, req, route{key: key}, err)
		return
	}
	defer backend.Close()
	if req.ProtoMajor >= 2 {
		r.relayStream(w, req, backend)
		return
	}
	client, rw, err := w.Hijack()
	if err != nil {
		w.answer(http.StatusInternalServerError, "the connection cannot be taken over", err)
		return
	}
	defer client.Close()
	w.status = http.StatusOK
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		w.err = err
		return
	}
	// rw's reader holds what the client sent right behind its request.
	w.err = relay(backend, client, rw, func() { client.Close() })
}

// relayStream relays over an HTTP/2 CONNECT stream: the request body is
// what the client sends, the response body what it receives.
func (r *Router) relayStream(w *recorder, req *http.Request, backend net.Conn) {
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		w.err = err
		return
	}
	w.err = relay(backend, flushWriter{w, rc}, req.Body, nil)
}

type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// relay copies both ways until the workload's side ends (it closed, or
// the client's end of input reached it and it closed in turn). The
// client's end of input closes the backend's write side, so the workload
// sees it. closeClient, when set, closes the client's connection once the
// workload's side ended, which ends the upward copy too; without it (an
// HTTP/2 stream, which ends with the handler) relay does not wait for the
// upward copy. The error is the first that was not an orderly end.
func relay(backend net.Conn, toClient io.Writer, fromClient io.Reader, closeClient func()) error {
	up := make(chan error, 1)
	go func() {
		_, err := io.Copy(backend, fromClient)
		if tc, ok := backend.(*net.TCPConn); ok {
			tc.CloseWrite() //nolint:errcheck // the workload may be gone already
		}
		up <- err
	}()
	_, down := io.Copy(toClient, backend)
	if closeClient == nil {
		return quiet(down)
	}
	closeClient()
	return errors.Join(quiet(down), quiet(<-up))
}

// quiet drops the errors of a connection closed by the other direction.
func quiet(err error) error {
	if err == nil || errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// tunnelPort is the port a CONNECT's authority names.
func tunnelPort(authority string) (int, error) {
	_, p, err := net.SplitHostPort(authority)
	if err != nil {
		return 0, errNoPort
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return 0, fmt.Errorf("port %q: want 1..65535", p)
	}
	return port, nil
}

// tunnelToken is the API token a CONNECT carries: Proxy-Authorization
// (Bearer, or Basic with the token as password), else Authorization
// (Bearer).
func tunnelToken(req *http.Request) string {
	for _, h := range []string{"Proxy-Authorization", "Authorization"} {
		v := req.Header.Get(h)
		if t, ok := strings.CutPrefix(v, "Bearer "); ok {
			return strings.TrimSpace(t)
		}
		if b, ok := strings.CutPrefix(v, "Basic "); ok && h == "Proxy-Authorization" {
			raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b))
			if _, pass, found := strings.Cut(string(raw), ":"); err == nil && found {
				return pass
			}
		}
	}
	return ""
}

// authorizeTunnel asks the control plane whether the request's token may
// reach key: the token, not the router's own credential, reads the actor,
// so the API's rules for the space decide, on every tunnel. A control
// plane that cannot answer is asked again, within ParkTimeout.
func (r *Router) authorizeTunnel(ctx context.Context, req *http.Request, key ActorKey) error {
	token := tunnelToken(req)
	if token == "" {
		return errNoCredential
	}
	err := r.askParked(ctx, "check the tunnel's token for actor "+key.String(), func(ctx context.Context) error {
		check := connect.NewRequest(&torporv1.GetRequest{Space: key.Space, Name: key.Name})
		check.Header().Set("Authorization", "Bearer "+token)
		_, err := r.api.GetActor(ctx, check)
		return err
	})
	if errors.Is(err, errControlPlaneDown) {
		return err
	}
	if err != nil {
		return fmt.Errorf("check the tunnel's token for actor %s: %w", key, err)
	}
	return nil
}

// refuseTunnel answers a CONNECT whose token the control plane did not
// accept for key (or could not check: then as requests are answered).
func (r *Router) refuseTunnel(w *recorder, req *http.Request, key ActorKey, err error) {
	if errors.Is(err, errNoCredential) {
		w.Header().Set("Proxy-Authenticate", `Basic realm="torpor"`)
		w.answer(http.StatusProxyAuthRequired, err.Error(), err)
		return
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated:
		w.Header().Set("Proxy-Authenticate", `Basic realm="torpor"`)
		w.answer(http.StatusProxyAuthRequired, "the API token is invalid or expired", err)
	case connect.CodePermissionDenied:
		w.answer(http.StatusForbidden, fmt.Sprintf("the token gives no access to actor %s", key), err)
	default:
		r.writeError(w, req, route{key: key}, err)
	}
}
