package node

// The node's own identity. A node agent talks to the control plane only
// over mutual TLS, with a certificate from the control plane's CA naming
// this node (spiffe://<trust domain>/node/<name>):
//
//   - the first run spends a join token on it (IdentityService.JoinNode),
//     trusting a server only if its chain ends in the CA the operator
//     pinned (Config.CAFingerprint);
//   - the certificate, its key and the CA are kept in the state directory,
//     so a restarted agent needs no token;
//   - it is renewed (RenewNodeCertificate, a new key each time) when two
//     thirds of what was left of its lifetime have passed.
//
// The agent serves its API with the same certificate and accepts only the
// control plane's (spiffe://<trust domain>/server).

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/identity"
)

// credentialsFile, in the state directory, keeps the node's key (mode
// 0600, like every record there), certificate chain and trust bundle, in
// one file so they are always replaced together.
const credentialsFile = "node-credentials.json"

type savedCredentials struct {
	// Key is PKCS#8 DER; Chain and Bundle are DER certificates.
	Key    []byte   `json:"key"`
	Chain  [][]byte `json:"chain"`
	Bundle [][]byte `json:"bundle"`
}

// credentials are the node's certificate and the CA it trusts.
type credentials struct {
	keypair     *identity.Keypair
	roots       *x509.CertPool
	trustDomain string
}

func (a *Agent) credentialsPath() string { return filepath.Join(a.cfg.StateDir, credentialsFile) }

// credentials returns the node's saved certificate if it is usable, and
// joins the control plane for one otherwise.
func (a *Agent) credentials(ctx context.Context) (*credentials, error) {
	creds, err := a.loadCredentials()
	if err == nil {
		a.log.Info("using the node certificate in the state directory", "expires", creds.keypair.Certificate().Leaf.NotAfter)
		return creds, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		a.log.Warn("the node certificate in the state directory is not usable; joining again", "err", err)
	}
	if a.cfg.JoinToken == nil || a.cfg.CAFingerprint == "" {
		return nil, fmt.Errorf("node %s has no usable certificate (%v): join it with a join token and the CA fingerprint (torpor token create --node %s)", a.cfg.Name, err, a.cfg.Name)
	}
	return a.join(ctx)
}

// loadCredentials reads the saved certificate; it is usable if it is this
// node's, not expired, signed by the saved CA, and that CA is the pinned
// one (when one is pinned).
func (a *Agent) loadCredentials() (*credentials, error) {
	var saved savedCredentials
	if err := readJSON(a.credentialsPath(), &saved); err != nil {
		return nil, err
	}
	parsed, err := x509.ParsePKCS8PrivateKey(saved.Key)
	if err != nil {
		return nil, fmt.Errorf("%s: key: %w", a.credentialsPath(), err)
	}
	key, ok := parsed.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: a %T key cannot sign", a.credentialsPath(), parsed)
	}
	chain, bundle := saved.Chain, saved.Bundle
	if a.cfg.CAFingerprint != "" && !slices.ContainsFunc(bundle, func(der []byte) bool { return identity.Fingerprint(der) == a.cfg.CAFingerprint }) {
		return nil, fmt.Errorf("it is from another CA than %s", a.cfg.CAFingerprint)
	}
	return a.checkCredentials(key, chain, bundle)
}

// checkCredentials pairs key with an issued chain and checks that the
// certificate is this node's, current, and from the bundle's CA.
func (a *Agent) checkCredentials(key crypto.Signer, chain, bundle [][]byte) (*credentials, error) {
	cert, err := identity.TLSCertificate(key, chain)
	if err != nil {
		return nil, err
	}
	roots, err := identity.CertPool(bundle)
	if err != nil {
		return nil, err
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	if len(cert.Leaf.URIs) != 1 || cert.Leaf.URIs[0].Scheme != "spiffe" {
		return nil, fmt.Errorf("node certificate names %v, not one SPIFFE ID", cert.Leaf.URIs)
	}
	td := cert.Leaf.URIs[0].Host
	if node, ok := identity.NodeFromCertificate(cert.Leaf, td); !ok || node != a.cfg.Name {
		return nil, fmt.Errorf("the certificate is %s's, not node %s's", cert.Leaf.URIs[0], a.cfg.Name)
	}
	return &credentials{keypair: identity.NewKeypair(cert), roots: roots, trustDomain: td}, nil
}

// join spends a join token on the node's first certificate. A control
// plane that cannot be reached yet is retried until ctx ends; a refusal
// is final.
func (a *Agent) join(ctx context.Context) (*credentials, error) {
	token, err := a.cfg.JoinToken(ctx)
	if err != nil {
		return nil, fmt.Errorf("node %s: join token: %w", a.cfg.Name, err)
	}
	key, csr, err := identity.NewCSR()
	if err != nil {
		return nil, err
	}
	tlsConfig := identity.BootstrapTLSConfig(a.cfg.CAFingerprint)
	verify := tlsConfig.VerifyConnection
	tlsConfig.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := verify(cs); err != nil {
			return &untrustedServerError{err}
		}
		return nil
	}
	client := torporv1connect.NewIdentityServiceClient(
		&http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: true, DisableKeepAlives: true}},
		a.serverURL())
	backoff := 100 * time.Millisecond
	for {
		callCtx, cancel := context.WithTimeout(ctx, controlPlaneTimeout)
		resp, err := client.JoinNode(callCtx, connect.NewRequest(&torporv1.JoinNodeRequest{Token: token, Node: a.cfg.Name, Csr: csr}))
		cancel()
		if err == nil {
			creds, err := a.checkCredentials(key, resp.Msg.GetCertificateChain(), resp.Msg.GetTrustBundle())
			if err != nil {
				return nil, fmt.Errorf("node %s: the certificate the control plane issued: %w", a.cfg.Name, err)
			}
			if err := a.saveCredentials(key, resp.Msg.GetCertificateChain(), resp.Msg.GetTrustBundle()); err != nil {
				return nil, err
			}
			a.log.Info("joined the control plane", "server", a.cfg.ServerURL, "spiffe_id", resp.Msg.GetSpiffeId(), "expires", creds.keypair.Certificate().Leaf.NotAfter)
			return creds, nil
		}
		var untrusted *untrustedServerError
		if code := connect.CodeOf(err); code != connect.CodeUnavailable && code != connect.CodeDeadlineExceeded || errors.As(err, &untrusted) || ctx.Err() != nil {
			return nil, fmt.Errorf("node %s: join the control plane at %s: %w", a.cfg.Name, a.cfg.ServerURL, err)
		}
		a.log.Warn("joining the control plane failed; retrying", "server", a.cfg.ServerURL, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, a.cfg.HeartbeatInterval)
	}
}

// untrustedServerError is a server that is not the pinned CA's: joining it
// again would not help.
type untrustedServerError struct{ err error }

func (e *untrustedServerError) Error() string {
	return "the server is not one of the CA the fingerprint pins: " + e.err.Error()
}

func (e *untrustedServerError) Unwrap() error { return e.err }

// saveCredentials replaces the saved key, certificate and CA at once.
func (a *Agent) saveCredentials(key crypto.Signer, chain, bundle [][]byte) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeJSON(a.credentialsPath(), savedCredentials{Key: keyDER, Chain: chain, Bundle: bundle}); err != nil {
		return fmt.Errorf("node credentials: %w", err)
	}
	return nil
}

// keepCertificate renews the node certificate when two thirds of what was
// left of its lifetime have passed, until ctx ends; failures are retried
// with backoff.
func (a *Agent) keepCertificate(ctx context.Context, creds *credentials) {
	retry := time.Second
	for {
		leaf := creds.keypair.Certificate().Leaf
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(leaf.NotAfter) * 2 / 3):
		}
		if err := a.renewCertificate(ctx, creds); err != nil {
			if ctx.Err() != nil {
				return
			}
			a.log.Warn("renewing the node certificate failed; retrying", "err", err, "expires", leaf.NotAfter, "retry_in", retry)
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(2*retry, time.Minute)
			continue
		}
		retry = time.Second
	}
}

func (a *Agent) renewCertificate(ctx context.Context, creds *credentials) error {
	key, csr, err := identity.NewCSR()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, controlPlaneTimeout)
	defer cancel()
	resp, err := a.identityClient.RenewNodeCertificate(ctx, connect.NewRequest(&torporv1.RenewNodeCertificateRequest{Csr: csr}))
	if err != nil {
		return err
	}
	renewed, err := a.checkCredentials(key, resp.Msg.GetCertificateChain(), resp.Msg.GetTrustBundle())
	if err != nil {
		return fmt.Errorf("the renewed certificate: %w", err)
	}
	if err := a.saveCredentials(key, resp.Msg.GetCertificateChain(), resp.Msg.GetTrustBundle()); err != nil {
		return err
	}
	cert := renewed.keypair.Certificate()
	creds.keypair.Set(*cert)
	a.log.Info("renewed the node certificate", "expires", cert.Leaf.NotAfter)
	return nil
}

// controlPlaneClient calls the control plane as this node, accepting only
// a replica's certificate from the node's CA.
func (c *credentials) controlPlaneClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:   identity.ClientTLSConfig(c.keypair, c.roots, identity.ServerID(c.trustDomain)),
		ForceAttemptHTTP2: true,
		IdleConnTimeout:   90 * time.Second,
	}}
}

// onlyControlPlane lets through requests whose client certificate (which
// the TLS layer verified against the node's CA) is the control plane's.
func (c *credentials) onlyControlPlane(next http.Handler) http.Handler {
	want := identity.ServerID(c.trustDomain)
	errWriter := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			errWriter.Write(w, r, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("the node agent API needs the control plane's client certificate (%s)", want)))
			return
		}
		leaf := r.TLS.VerifiedChains[0][0]
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
			errWriter.Write(w, r, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("only the control plane (%s) may call the node agent API, not %v", want, leaf.URIs)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// serverTLS serves the agent API with the node certificate; client
// certificates are verified against the node's CA (onlyControlPlane
// decides whose are accepted).
func (c *credentials) serverTLS() *tls.Config { return identity.ServerTLSConfig(c.keypair, c.roots) }

func (a *Agent) serverURL() string { return strings.TrimSuffix(a.cfg.ServerURL, "/") }
