package identity

// Members: the processes of an installation other than the control plane
// (node agents, routers, other API clients) each hold a certificate from
// the control plane's CA naming them (NodeID or ClientID):
//
//   - the first run spends a join token on it (IdentityService.Join),
//     trusting a server only if its chain ends in the CA the operator
//     pinned (Member.CAFingerprint);
//   - the certificate, its key and the CA are kept in one file, so a
//     restarted member needs no token;
//   - it is renewed (RenewCertificate, a new key each time) when two thirds
//     of what was left of its lifetime have passed.

import (
	"cmp"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/atomicfile"
	"github.com/torpor-dev/torpor/internal/retry"
)

// MemberKind says what a member is, and so which SPIFFE ID it carries.
type MemberKind string

const (
	MemberNode   MemberKind = "node"
	MemberClient MemberKind = "client"
)

// Member defaults.
const (
	DefaultCallTimeout   = 10 * time.Second
	DefaultJoinRetryMax  = 5 * time.Second
	defaultRenewRetryMax = time.Minute
)

// Member keeps one member's certificate.
type Member struct {
	Kind MemberKind
	// Name is the member's name (a DNS-1123 label).
	Name string
	// ServerURL is the control plane's API, https://HOST:PORT.
	ServerURL string
	// File keeps the key, certificate chain and CA, mode 0600.
	File string
	// CAFingerprint pins the control plane's CA ("sha256:<hex>", printed
	// with the join token). A saved certificate of another CA is not used.
	CAFingerprint string
	// JoinToken returns a join token for Name. It is called only when
	// there is no usable saved certificate.
	JoinToken func(ctx context.Context) (string, error)
	// KubernetesToken, instead of JoinToken on Kubernetes, returns the
	// member's pod's projected ServiceAccount token (read afresh for
	// every join: the kubelet rotates it), which the control plane
	// verifies with the API server.
	KubernetesToken func(ctx context.Context) (string, error)
	// JoinRetryMax caps the wait between attempts to reach a control plane
	// that does not answer yet (default DefaultJoinRetryMax).
	JoinRetryMax time.Duration
	// CallTimeout bounds each call to the control plane (default
	// DefaultCallTimeout).
	CallTimeout time.Duration
	Logger      *slog.Logger
}

// Credentials are a member's current certificate and the CA it trusts.
type Credentials struct {
	keypair     *Keypair
	roots       *x509.CertPool
	bundle      [][]byte
	trustDomain string
}

// Keypair is the member's certificate; renewals replace it in place.
func (c *Credentials) Keypair() *Keypair { return c.keypair }

// Roots is the CA the member trusts.
func (c *Credentials) Roots() *x509.CertPool { return c.roots }

// TrustBundle is the CA the member trusts, as DER certificates.
func (c *Credentials) TrustBundle() [][]byte { return c.bundle }

// TrustDomain is the trust domain of the member's certificate.
func (c *Credentials) TrustDomain() string { return c.trustDomain }

// ControlPlaneClient calls the control plane as the member, accepting only
// a replica's certificate from the member's CA.
func (c *Credentials) ControlPlaneClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:   ClientTLSConfig(c.keypair, c.roots, ServerID(c.trustDomain)),
		ForceAttemptHTTP2: true,
		IdleConnTimeout:   90 * time.Second,
	}}
}

// ServerTLSConfig serves with the member's certificate, verifying client
// certificates against its CA.
func (c *Credentials) ServerTLSConfig() *tls.Config { return ServerTLSConfig(c.keypair, c.roots) }

// savedCredentials is the file's content, all in one so that key,
// certificate and CA are always replaced together.
type savedCredentials struct {
	// Key is PKCS#8 DER; Chain and Bundle are DER certificates.
	Key    []byte   `json:"key"`
	Chain  [][]byte `json:"chain"`
	Bundle [][]byte `json:"bundle"`
}

func (m *Member) log() *slog.Logger { return cmp.Or(m.Logger, slog.Default()) }

func (m *Member) serverURL() string { return strings.TrimSuffix(m.ServerURL, "/") }

// Credentials returns the saved certificate if it is usable, and joins the
// control plane for one otherwise.
func (m *Member) Credentials(ctx context.Context) (*Credentials, error) {
	creds, err := m.LoadCredentials()
	if err == nil {
		m.log().Info("using the saved certificate", "file", m.File, "expires", creds.keypair.Certificate().Leaf.NotAfter)
		return creds, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		m.log().Warn("the saved certificate is not usable; joining again", "file", m.File, "err", err)
	}
	if !m.canJoin() {
		return nil, fmt.Errorf("%s %s has no usable certificate (%v): join it with a join token and the CA fingerprint (torpor token create --%s %s), or on Kubernetes with its pod's ServiceAccount token", m.Kind, m.Name, err, m.Kind, m.Name)
	}
	return m.Join(ctx)
}

// LoadCredentials reads the saved certificate; it is usable if it is this
// member's, not expired, signed by the saved CA, and that CA is the pinned
// one (when one is pinned). A missing file is fs.ErrNotExist.
func (m *Member) LoadCredentials() (*Credentials, error) {
	data, err := os.ReadFile(m.File)
	if err != nil {
		return nil, err
	}
	var saved savedCredentials
	if err := json.Unmarshal(data, &saved); err != nil {
		return nil, fmt.Errorf("%s: %w", m.File, err)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(saved.Key)
	if err != nil {
		return nil, fmt.Errorf("%s: key: %w", m.File, err)
	}
	key, ok := parsed.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: a %T key cannot sign", m.File, parsed)
	}
	if m.CAFingerprint != "" && !slices.ContainsFunc(saved.Bundle, func(der []byte) bool { return Fingerprint(der) == m.CAFingerprint }) {
		return nil, fmt.Errorf("%s: it is from another CA than %s", m.File, m.CAFingerprint)
	}
	return m.check(key, saved.Chain, saved.Bundle)
}

// check pairs key with an issued chain and checks that the certificate is
// this member's, current, and from the bundle's CA.
func (m *Member) check(key crypto.Signer, chain, bundle [][]byte) (*Credentials, error) {
	cert, err := TLSCertificate(key, chain)
	if err != nil {
		return nil, err
	}
	roots, err := CertPool(bundle)
	if err != nil {
		return nil, err
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("%s certificate: %w", m.Kind, err)
	}
	if len(cert.Leaf.URIs) != 1 || cert.Leaf.URIs[0].Scheme != "spiffe" {
		return nil, fmt.Errorf("%s certificate names %v, not one SPIFFE ID", m.Kind, cert.Leaf.URIs)
	}
	td := cert.Leaf.URIs[0].Host
	if want := spiffeURL(td, string(m.Kind), m.Name).String(); cert.Leaf.URIs[0].String() != want {
		return nil, fmt.Errorf("the certificate is %s's, not %s's", cert.Leaf.URIs[0], want)
	}
	return &Credentials{keypair: NewKeypair(cert), roots: roots, bundle: bundle, trustDomain: td}, nil
}

// canJoin: the member has a token to join with and a CA to pin.
func (m *Member) canJoin() bool {
	return (m.JoinToken != nil || m.KubernetesToken != nil) && m.CAFingerprint != ""
}

// joinRequest is the request that joins the member with its token.
func (m *Member) joinRequest(ctx context.Context, csr []byte) (*torporv1.JoinRequest, error) {
	req := &torporv1.JoinRequest{Name: m.Name, Csr: csr}
	var err error
	if m.JoinToken != nil {
		if req.Token, err = m.JoinToken(ctx); err != nil {
			return nil, fmt.Errorf("%s %s: join token: %w", m.Kind, m.Name, err)
		}
		return req, nil
	}
	if req.KubernetesToken, err = m.KubernetesToken(ctx); err != nil {
		return nil, fmt.Errorf("%s %s: Kubernetes ServiceAccount token: %w", m.Kind, m.Name, err)
	}
	return req, nil
}

// Join spends a join token (or presents the pod's ServiceAccount token)
// on a new certificate for the member, replacing any saved one. A control
// plane that cannot be reached yet is retried until ctx ends; a refusal
// is final.
func (m *Member) Join(ctx context.Context) (*Credentials, error) {
	if !m.canJoin() {
		return nil, fmt.Errorf("%s %s: joining needs a join token (or a Kubernetes ServiceAccount token) and the CA fingerprint", m.Kind, m.Name)
	}
	key, csr, err := NewCSR()
	if err != nil {
		return nil, err
	}
	tlsConfig := BootstrapTLSConfig(m.CAFingerprint)
	verify := tlsConfig.VerifyConnection
	tlsConfig.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := verify(cs); err != nil {
			return &untrustedServerError{err}
		}
		return nil
	}
	client := torporv1connect.NewIdentityServiceClient(
		&http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: true, DisableKeepAlives: true}},
		m.serverURL())
	b := retry.Policy{Initial: 100 * time.Millisecond, Max: cmp.Or(m.JoinRetryMax, DefaultJoinRetryMax)}.Start()
	for {
		req, err := m.joinRequest(ctx, csr)
		if err != nil {
			return nil, err
		}
		callCtx, cancel := context.WithTimeout(ctx, cmp.Or(m.CallTimeout, DefaultCallTimeout))
		resp, err := client.Join(callCtx, connect.NewRequest(req))
		cancel()
		if err == nil {
			creds, err := m.check(key, resp.Msg.GetCertificateChain(), resp.Msg.GetTrustBundle())
			if err != nil {
				return nil, fmt.Errorf("%s %s: the certificate the control plane issued: %w", m.Kind, m.Name, err)
			}
			if err := m.save(key, resp.Msg.GetCertificateChain(), resp.Msg.GetTrustBundle()); err != nil {
				return nil, err
			}
			m.log().Info("joined the control plane", "server", m.ServerURL, "spiffe_id", resp.Msg.GetSpiffeId(), "expires", creds.keypair.Certificate().Leaf.NotAfter)
			return creds, nil
		}
		var untrusted *untrustedServerError
		if code := connect.CodeOf(err); code != connect.CodeUnavailable && code != connect.CodeDeadlineExceeded || errors.As(err, &untrusted) || ctx.Err() != nil {
			return nil, fmt.Errorf("%s %s: join the control plane at %s: %w", m.Kind, m.Name, m.ServerURL, err)
		}
		m.log().Warn("joining the control plane failed; retrying", "server", m.ServerURL, "err", err)
		if !b.Wait(ctx) {
			return nil, ctx.Err()
		}
	}
}

// untrustedServerError is a server that is not the pinned CA's: joining it
// again would not help.
type untrustedServerError struct{ err error }

func (e *untrustedServerError) Error() string {
	return "the server is not one of the CA the fingerprint pins: " + e.err.Error()
}

func (e *untrustedServerError) Unwrap() error { return e.err }

// save replaces the saved key, certificate and CA at once.
func (m *Member) save(key crypto.Signer, chain, bundle [][]byte) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	data, err := json.Marshal(savedCredentials{Key: keyDER, Chain: chain, Bundle: bundle})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(m.File, data, 0o600); err != nil {
		return fmt.Errorf("%s credentials: %w", m.Kind, err)
	}
	return nil
}

// KeepRenewed renews creds when two thirds of what was left of their
// lifetime have passed, until ctx ends; failures are retried with backoff.
func (m *Member) KeepRenewed(ctx context.Context, creds *Credentials) {
	client := torporv1connect.NewIdentityServiceClient(creds.ControlPlaneClient(), m.serverURL())
	b := retry.Policy{Initial: time.Second, Max: defaultRenewRetryMax}.Start()
	for {
		leaf := creds.keypair.Certificate().Leaf
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(leaf.NotAfter) * 2 / 3):
		}
		if err := m.renew(ctx, client, creds); err != nil {
			if ctx.Err() != nil {
				return
			}
			m.log().Warn("renewing the certificate failed; retrying", "err", err, "expires", leaf.NotAfter)
			if !b.Wait(ctx) {
				return
			}
			continue
		}
		b.Reset()
	}
}

func (m *Member) renew(ctx context.Context, client torporv1connect.IdentityServiceClient, creds *Credentials) error {
	key, csr, err := NewCSR()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(m.CallTimeout, DefaultCallTimeout))
	defer cancel()
	resp, err := client.RenewCertificate(ctx, connect.NewRequest(&torporv1.RenewCertificateRequest{Csr: csr}))
	if err != nil {
		return err
	}
	renewed, err := m.check(key, resp.Msg.GetCertificateChain(), resp.Msg.GetTrustBundle())
	if err != nil {
		return fmt.Errorf("the renewed certificate: %w", err)
	}
	if err := m.save(key, resp.Msg.GetCertificateChain(), resp.Msg.GetTrustBundle()); err != nil {
		return err
	}
	cert := renewed.keypair.Certificate()
	creds.keypair.Set(*cert)
	m.log().Info("renewed the certificate", "expires", cert.Leaf.NotAfter)
	return nil
}

// RenewIfDue renews creds now if two thirds of their lifetime have passed:
// for short-lived clients (the CLI) that cannot keep renewing in the
// background.
func (m *Member) RenewIfDue(ctx context.Context, creds *Credentials) error {
	leaf := creds.keypair.Certificate().Leaf
	if time.Now().Before(leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)) {
		return nil
	}
	client := torporv1connect.NewIdentityServiceClient(creds.ControlPlaneClient(), m.serverURL())
	if err := m.renew(ctx, client, creds); err != nil {
		return fmt.Errorf("%s %s: renew the certificate (expires %s): %w", m.Kind, m.Name, leaf.NotAfter.Format(time.RFC3339), err)
	}
	return nil
}
