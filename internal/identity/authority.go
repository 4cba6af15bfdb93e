// Package identity is Torpor's certificate authority and token issuer.
//
// The CA (ECDSA P-256) and the JWT signing key are created by the first
// server that needs them and kept in the store's secrets, so every replica
// signs with the same keys and a restart keeps them; private keys never
// leave the control plane (callers send certificate requests).
//
// Identities are SPIFFE IDs, each certificate carrying exactly one as its
// URI SAN:
//
//	spiffe://<trust-domain>/node/<node>               node agents (client and server auth)
//	spiffe://<trust-domain>/client/<name>             API clients such as routers (client auth)
//	spiffe://<trust-domain>/server                    control plane replicas (plus DNS/IP SANs)
//	spiffe://<trust-domain>/space/<space>/actor/<name> actors (workloads)
//
// SPIFFE allows one URI SAN per certificate, so a workload certificate
// carries its actor's UID in the subject's serialNumber attribute (OID
// 2.5.4.5): the SPIFFE ID names the actor, the UID tells this incarnation
// of the name from a deleted and re-created one. See WorkloadFromCertificate.
// Client certificates carry their client's UID the same way.
//
// Minting for an actor is authorized against the store on every call
// (AuthorizeWorkload), never against a cache (DESIGN invariant 4).
package identity

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"regexp"
	"sync"
	"time"
)

// DefaultTrustDomain is the trust domain of an installation that names none.
const DefaultTrustDomain = "torpor.local"

// Lifetimes a zero Config field stands for.
const (
	DefaultMemberCertTTL   = 24 * time.Hour
	DefaultServerCertTTL   = 7 * 24 * time.Hour
	DefaultWorkloadCertTTL = time.Hour
	DefaultJWTTTL          = 10 * time.Minute
	caLifetime             = 10 * 365 * 24 * time.Hour
	// backdate covers clocks slightly behind the server's.
	backdate = time.Minute
)

// Names of the secrets the Authority keeps.
const (
	caSecret     = "identity/ca"
	jwtKeySecret = "identity/jwt-signing-key"
)

// Config sets up an Authority; zero fields take the defaults above.
type Config struct {
	// TrustDomain of every SPIFFE ID issued.
	TrustDomain string
	// Issuer is the iss of JWTs: the control plane's URL, under which
	// WellKnown is served.
	Issuer string
	// MemberCertTTL is the lifetime of node and API client certificates.
	MemberCertTTL   time.Duration
	ServerCertTTL   time.Duration
	WorkloadCertTTL time.Duration
	JWTTTL          time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

var trustDomainPattern = regexp.MustCompile(`^[a-z0-9._-]{1,255}$`)

func (c Config) withDefaults() (Config, error) {
	c.TrustDomain = cmp.Or(c.TrustDomain, DefaultTrustDomain)
	if !trustDomainPattern.MatchString(c.TrustDomain) {
		return c, fmt.Errorf("identity: trust domain %q: want lower-case letters, digits, '.', '-' and '_'", c.TrustDomain)
	}
	c.MemberCertTTL = cmp.Or(c.MemberCertTTL, DefaultMemberCertTTL)
	c.ServerCertTTL = cmp.Or(c.ServerCertTTL, DefaultServerCertTTL)
	c.WorkloadCertTTL = cmp.Or(c.WorkloadCertTTL, DefaultWorkloadCertTTL)
	c.JWTTTL = cmp.Or(c.JWTTTL, DefaultJWTTTL)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// Authority issues certificates, JWTs and tokens.
type Authority struct {
	cfg     Config
	secrets Secrets
	ca      *x509.Certificate
	caKey   *ecdsa.PrivateKey
	jwt     *jwtSigner
}

// Load reads the CA and signing key from secrets, creating them if this is
// the installation's first server. Replicas starting together end up with
// the same ones.
func Load(ctx context.Context, secrets Secrets, cfg Config) (*Authority, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	caPEM, err := secrets.GetOrCreateSecret(ctx, caSecret, func() ([]byte, error) { return newCA(cfg) })
	if err != nil {
		return nil, fmt.Errorf("identity: load CA: %w", err)
	}
	ca, caKey, err := parseCA(caPEM)
	if err != nil {
		return nil, fmt.Errorf("identity: secret %s: %w", caSecret, err)
	}
	keyPEM, err := secrets.GetOrCreateSecret(ctx, jwtKeySecret, newKeyPEM)
	if err != nil {
		return nil, fmt.Errorf("identity: load JWT signing key: %w", err)
	}
	jwtKey, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("identity: secret %s: %w", jwtKeySecret, err)
	}
	signer, err := newJWTSigner(jwtKey, cfg.Issuer)
	if err != nil {
		return nil, err
	}
	return &Authority{cfg: cfg, secrets: secrets, ca: ca, caKey: caKey, jwt: signer}, nil
}

// TrustDomain is the trust domain of every identity issued.
func (a *Authority) TrustDomain() string { return a.cfg.TrustDomain }

// CACertificate is the root every issued certificate chains to.
func (a *Authority) CACertificate() *x509.Certificate { return a.ca }

// TrustBundle is the DER CA certificates peers are verified with.
func (a *Authority) TrustBundle() [][]byte { return [][]byte{a.ca.Raw} }

// Roots is TrustBundle as a pool.
func (a *Authority) Roots() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(a.ca)
	return pool
}

// CAFingerprint is "sha256:<hex>" of the CA certificate, what a joining
// node pins (BootstrapTLSConfig).
func (a *Authority) CAFingerprint() string { return Fingerprint(a.ca.Raw) }

// Fingerprint is "sha256:<hex>" of a DER certificate.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func newCA(cfg Config) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := cfg.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{Organization: []string{"torpor"}, CommonName: "Torpor CA " + cfg.TrustDomain},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs:                  []*url.URL{trustDomainURL(cfg.TrustDomain)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	pem.Encode(&out, &pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	return out.Bytes(), nil
}

func parseCA(data []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certBlock, rest := pem.Decode(data)
	if certBlock == nil || certBlock.Type != "CERTIFICATE" {
		return nil, nil, errors.New("no CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := parseKey(rest)
	if err != nil {
		return nil, nil, err
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, nil, errors.New("the private key does not belong to the certificate")
	}
	return cert, key, nil
}

func newKeyPEM() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseKey(data []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("no PRIVATE KEY block")
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if !ok || key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("key is %T, want ECDSA P-256", parsed)
	}
	return key, nil
}

// randomSerial is 128 random bits: unique without coordination between
// replicas.
func randomSerial() *big.Int {
	b := make([]byte, 16)
	rand.Read(b)
	return new(big.Int).SetBytes(b)
}

// Loader loads the Authority on first use and keeps it, so a server comes
// up (and serves everything else) while its store is briefly unreachable;
// a failed load is retried by the next caller.
type Loader struct {
	secrets Secrets
	cfg     Config

	mu        sync.Mutex
	authority *Authority
}

// NewLoader reads nothing yet; a bad cfg fails the first Authority call.
func NewLoader(secrets Secrets, cfg Config) *Loader {
	return &Loader{secrets: secrets, cfg: cfg}
}

// TrustDomain is known without loading the keys.
func (l *Loader) TrustDomain() string { return cmp.Or(l.cfg.TrustDomain, DefaultTrustDomain) }

// Authority loads the keys the first time it succeeds.
func (l *Loader) Authority(ctx context.Context) (*Authority, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.authority != nil {
		return l.authority, nil
	}
	a, err := Load(ctx, l.secrets, l.cfg)
	if err != nil {
		return nil, err
	}
	l.authority = a
	return a, nil
}
