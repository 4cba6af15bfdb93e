package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/torpor-dev/torpor/internal/httpserve"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/rungroup"
)

// certRetry is how soon a failed renewal of the server certificate is
// tried again.
const certRetry = time.Minute

// ServeAPI serves the API (Handler) over TLS on ln until ctx is done, its
// certificate renewed meanwhile; see TLSConfig.
func (s *Server) ServeAPI(ctx context.Context, ln net.Listener) error {
	cfg, renew, err := s.TLSConfig(ctx, ln.Addr())
	if err != nil {
		return fmt.Errorf("serve API: %w", err)
	}
	g := rungroup.New(ctx)
	g.Go("server certificate renewal", renew)
	g.Go("API", func(ctx context.Context) error { return httpserve.Serve(ctx, ln, s.Handler(), cfg) })
	return g.Run(ctx)
}

// TLSConfig is what the API is served with on addr: a server certificate
// from the CA for the names clients use (the listen host, Options.TLSNames,
// 127.0.0.1 and localhost), and verification of the client certificates
// presented (node agents present theirs). The server also presents the
// certificate to node agents. renew replaces the certificate before it
// expires until its context is done: the caller runs it for as long as it
// serves with the config.
func (s *Server) TLSConfig(ctx context.Context, addr net.Addr) (cfg *tls.Config, renew func(context.Context) error, err error) {
	a, err := s.identity.Authority(ctx)
	if err != nil {
		return nil, nil, err
	}
	// The trust domain is the CA's: certificates of another one would not
	// verify with it.
	if uris := a.CACertificate().URIs; len(uris) != 1 || uris[0].Host != a.TrustDomain() {
		return nil, nil, fmt.Errorf("the CA in the store is for trust domain %v, not %s (the trust domain cannot change)", uris, a.TrustDomain())
	}
	names := s.certNames(addr)
	cert, err := a.ServerCertificate(names)
	if err != nil {
		return nil, nil, err
	}
	kp := identity.NewKeypair(cert)
	s.cert.Store(kp)
	renew = func(ctx context.Context) error { return s.renewCertificate(ctx, a, kp, names) }
	return identity.ServerTLSConfig(kp, a.Roots()), renew, nil
}

// certNames are the host names and addresses the server certificate
// carries: those a local client uses, the listen host (unless it is a
// wildcard address) and the configured ones.
func (s *Server) certNames(addr net.Addr) []string {
	names := []string{"127.0.0.1", "localhost"}
	for _, listen := range []string{s.opts.Listen, addr.String()} {
		host, _, err := net.SplitHostPort(listen)
		if err != nil || host == "" {
			continue
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			continue
		}
		names = append(names, host)
	}
	names = append(names, s.opts.TLSNames...)
	slices.Sort(names)
	return slices.Compact(names)
}

// renewCertificate replaces the server certificate when two thirds of its
// lifetime have passed, until ctx is done.
func (s *Server) renewCertificate(ctx context.Context, a *identity.Authority, kp *identity.Keypair, names []string) error {
	for {
		leaf := kp.Certificate().Leaf
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(leaf.NotAfter) * 2 / 3):
		}
		cert, err := a.ServerCertificate(names)
		if err != nil {
			s.log.Error("renew the server certificate", "err", err, "expires", leaf.NotAfter, "retry_in", certRetry)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(certRetry):
			}
			continue
		}
		kp.Set(cert)
		s.log.Info("renewed the server certificate", "expires", cert.Leaf.NotAfter)
	}
}

// agentTLS is how the server calls node: presenting its own certificate,
// and accepting only a certificate of that node from the CA.
func (s *Server) agentTLS(ctx context.Context, node string) (*tls.Config, error) {
	kp := s.cert.Load()
	if kp == nil {
		return nil, errors.New("the control plane has no certificate to call node agents with: it does not serve the API over TLS")
	}
	a, err := s.identity.Authority(ctx)
	if err != nil {
		return nil, err
	}
	return identity.ClientTLSConfig(kp, a.Roots(), identity.NodeID(a.TrustDomain(), node)), nil
}

// agentClient is an HTTP client (HTTP/2 over TLS) with cfg. Node calls
// last as long as their operation (a restore of a large actor takes
// seconds), so no call has a deadline; instead a node that stops answering
// at the transport level is found out early: dials and handshakes are
// bounded, and an HTTP/2 connection that goes quiet is pinged and dropped
// when the ping goes unanswered. The workflow engine then calls again.
func agentClient(cfg *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     cfg,
		ForceAttemptHTTP2:   true,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		TLSHandshakeTimeout: 5 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		HTTP2:               &http.HTTP2Config{SendPingTimeout: 5 * time.Second, PingTimeout: 5 * time.Second},
	}}
}
