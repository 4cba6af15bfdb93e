package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
)

// Keypair holds a process's current certificate; Set replaces it (renewal)
// and the next handshake uses the new one.
type Keypair struct {
	cur atomic.Pointer[tls.Certificate]
}

// NewKeypair holds cert.
func NewKeypair(cert tls.Certificate) *Keypair {
	k := &Keypair{}
	k.Set(cert)
	return k
}

// Set replaces the certificate.
func (k *Keypair) Set(cert tls.Certificate) { k.cur.Store(&cert) }

// Certificate is the current certificate.
func (k *Keypair) Certificate() *tls.Certificate { return k.cur.Load() }

// ServerTLSConfig serves with cert and verifies the client certificates
// that are presented against clientCAs (usually Authority.Roots or the
// trust bundle a node received). A client without a certificate still
// connects (API clients authenticate otherwise); CallerMiddleware tells
// handlers who a verified client is.
func ServerTLSConfig(cert *Keypair, clientCAs *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Certificates stays empty, so GetCertificate answers every
		// handshake (with or without SNI) and a renewal applies at once.
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Certificate(), nil },
		ClientAuth:     tls.VerifyClientCertIfGiven,
		ClientCAs:      clientCAs,
		NextProtos:     []string{"h2", "http/1.1"},
	}
}

// ClientTLSConfig verifies servers against roots and presents cert (nil:
// none). With serverID empty the server's host name is verified as usual;
// otherwise its certificate must carry that SPIFFE ID (node agents are
// reached by identity: NodeID; replicas share ServerID).
func ClientTLSConfig(cert *Keypair, roots *x509.CertPool, serverID string) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert.Certificate(), nil }
	}
	if serverID != "" {
		// The host name check gives way to the SPIFFE ID check, done in
		// full (chain included) by VerifyConnection.
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			leaf, err := verifyChain(cs.PeerCertificates, roots)
			if err != nil {
				return err
			}
			if len(leaf.URIs) != 1 || leaf.URIs[0].String() != serverID {
				return fmt.Errorf("server certificate names %v, want %s", leaf.URIs, serverID)
			}
			return nil
		}
	}
	return cfg
}

// BootstrapTLSConfig is for a node's first call (JoinNode), before it has
// a trust bundle: the server's chain must end in a CA whose fingerprint
// (CreateTokenResponse.ca_fingerprint) is caFingerprint, and its
// certificate must be a replica's (ServerID of the CA's trust domain).
func BootstrapTLSConfig(caFingerprint string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // replaced by VerifyConnection below
		VerifyConnection: func(cs tls.ConnectionState) error {
			i := slices.IndexFunc(cs.PeerCertificates, func(c *x509.Certificate) bool { return Fingerprint(c.Raw) == caFingerprint })
			if i < 1 {
				return fmt.Errorf("the server's chain has no CA with fingerprint %s", caFingerprint)
			}
			ca := cs.PeerCertificates[i]
			if len(ca.URIs) != 1 || ca.URIs[0].Scheme != "spiffe" {
				return fmt.Errorf("CA %s names no trust domain", caFingerprint)
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca)
			leaf, err := verifyChain(cs.PeerCertificates[:i], roots)
			if err != nil {
				return err
			}
			if want := ServerID(ca.URIs[0].Host); len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
				return fmt.Errorf("server certificate names %v, want %s", leaf.URIs, want)
			}
			return nil
		},
	}
}

func verifyChain(chain []*x509.Certificate, roots *x509.CertPool) (*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, errors.New("the server sent no certificate")
	}
	intermediates := x509.NewCertPool()
	for _, c := range chain[1:] {
		intermediates.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	return chain[0], nil
}

type callerKey struct{}

// caller is the member whose verified certificate came with a call: a
// node, or an API client (with its UID).
type caller struct {
	node              string
	client, clientUID string
}

// WithCallerNode marks ctx as a call from node. CallerMiddleware does it
// for a verified node certificate; tests call it directly.
func WithCallerNode(ctx context.Context, node string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller{node: node})
}

// WithCallerClient marks ctx as a call from API client name with uid.
func WithCallerClient(ctx context.Context, name, uid string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller{client: name, clientUID: uid})
}

// CallerNode is the node that made the call, if one did.
func CallerNode(ctx context.Context) (string, bool) {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c.node, c.node != ""
}

// CallerClient is the API client that made the call with its certificate,
// if one did. Its certificate was verified; whether the client still
// exists is for AuthenticateClient to say.
func CallerClient(ctx context.Context) (name, uid string, ok bool) {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c.client, c.clientUID, c.client != ""
}

// CallerMiddleware puts the calling member into each request's context
// when the request came with a node or client certificate of trustDomain
// that the TLS layer verified (r.TLS.VerifiedChains: serve with
// ServerTLSConfig). Anything else (plain HTTP, no or another kind of
// certificate) leaves no caller, and handlers needing one answer
// Unauthenticated.
func CallerMiddleware(trustDomain string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
			leaf := r.TLS.VerifiedChains[0][0]
			if slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
				if node, ok := NodeFromCertificate(leaf, trustDomain); ok {
					r = r.WithContext(WithCallerNode(r.Context(), node))
				} else if name, uid, ok := ClientFromCertificate(leaf, trustDomain); ok {
					r = r.WithContext(WithCallerClient(r.Context(), name, uid))
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}
