// Package httpserve serves an http.Handler until its context ends. It is a
// leaf: the control plane, the node agent and the router all serve with it,
// so the peers need not link the control plane to share it.
package httpserve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
)

// DefaultGrace bounds Serve's drain.
const DefaultGrace = 10 * time.Second

// Serve is ServeGrace with DefaultGrace.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, tlsConfig *tls.Config) error {
	return ServeGrace(ctx, ln, h, tlsConfig, DefaultGrace)
}

// ServeGrace serves h on ln until ctx is done, then drains: it stops
// accepting, closes idle connections, waits up to grace for the requests
// in flight, and closes the connections still open after that (their
// requests fail; a stop leaves nothing). It serves over TLS (HTTP/2 and
// HTTP/1.1) with tlsConfig, or in cleartext (HTTP/1.1 and HTTP/2 for
// gRPC) when it is nil. Connections a handler hijacked are the handler's
// to close.
func ServeGrace(ctx context.Context, ln net.Listener, h http.Handler, tlsConfig *tls.Config, grace time.Duration) error {
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	if tlsConfig != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	draining := make(chan struct{})
	srv := &http.Server{Handler: h, Protocols: protocols, TLSConfig: tlsConfig, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: log.New(serverErrorLog{}, "", 0),
		BaseContext: func(net.Listener) context.Context {
			return context.WithValue(context.Background(), drainingKey{}, (<-chan struct{})(draining))
		}}
	srv.RegisterOnShutdown(func() { close(draining) })
	errc := make(chan error, 1)
	go func() {
		if tlsConfig != nil {
			// The certificate comes from tlsConfig (GetCertificate).
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		slog.Default().Warn("requests still in flight at the end of the grace period: closing their connections", "listener", ln.Addr().String(), "grace", grace, "err", err)
		if err := srv.Close(); err != nil {
			return fmt.Errorf("close HTTP server on %s: %w", ln.Addr(), err)
		}
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type drainingKey struct{}

// Draining returns a channel that is closed when the server serving the
// request of ctx begins to shut down (nil outside Serve). A stream that
// lasts as long as its client wants (a watch) ends on it, so that the
// shutdown need not wait for it and its client reconnects elsewhere.
func Draining(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(drainingKey{}).(<-chan struct{})
	return ch
}

// serverErrorLog takes what http.Server reports. A failed TLS handshake
// (a peer whose certificate was refused, a port scanner) is the peer's
// problem: debug level. Anything else is an error.
type serverErrorLog struct{}

func (serverErrorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelError
	if strings.Contains(msg, "TLS handshake error") {
		level = slog.LevelDebug
	}
	slog.Default().Log(context.Background(), level, msg)
	return len(p), nil
}
