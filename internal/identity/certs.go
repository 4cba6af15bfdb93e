package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/validate"
)

// Workload is the actor a workload identity is issued to.
type Workload struct {
	Space, Actor, ActorUID string
}

// Issued is a certificate the CA signed.
type Issued struct {
	Certificate *x509.Certificate
	// Chain is DER: the certificate, then the CA.
	Chain    [][]byte
	SPIFFEID string
}

func trustDomainURL(trustDomain string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: trustDomain}
}

func spiffeURL(trustDomain string, segments ...string) *url.URL {
	u := trustDomainURL(trustDomain)
	u.Path = "/" + strings.Join(segments, "/")
	return u
}

// NodeID is the SPIFFE ID of a node agent.
func NodeID(trustDomain, node string) string { return spiffeURL(trustDomain, "node", node).String() }

// ServerID is the SPIFFE ID every control plane replica shares.
func ServerID(trustDomain string) string { return spiffeURL(trustDomain, "server").String() }

// ActorID is the SPIFFE ID of an actor's workload.
func ActorID(trustDomain, space, actor string) string {
	return spiffeURL(trustDomain, "space", space, "actor", actor).String()
}

// spiffeID returns the one SPIFFE ID of cert in trustDomain, split into
// its path segments.
func spiffeID(cert *x509.Certificate, trustDomain string) ([]string, bool) {
	if len(cert.URIs) != 1 {
		return nil, false
	}
	u := cert.URIs[0]
	if u.Scheme != "spiffe" || u.Host != trustDomain || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, false
	}
	return strings.Split(strings.TrimPrefix(u.Path, "/"), "/"), true
}

// NodeFromCertificate returns the node a node certificate of trustDomain
// names.
func NodeFromCertificate(cert *x509.Certificate, trustDomain string) (string, bool) {
	seg, ok := spiffeID(cert, trustDomain)
	if !ok || len(seg) != 2 || seg[0] != "node" || validate.Name("node", seg[1]) != nil {
		return "", false
	}
	return seg[1], true
}

// WorkloadFromCertificate reads the actor and its UID from a workload
// certificate of trustDomain (the UID is the subject's serialNumber).
func WorkloadFromCertificate(cert *x509.Certificate, trustDomain string) (Workload, error) {
	seg, ok := spiffeID(cert, trustDomain)
	if !ok || len(seg) != 4 || seg[0] != "space" || seg[2] != "actor" {
		return Workload{}, fmt.Errorf("certificate %v is not a workload certificate of trust domain %s", cert.URIs, trustDomain)
	}
	if cert.Subject.SerialNumber == "" {
		return Workload{}, fmt.Errorf("workload certificate %s carries no actor uid", cert.URIs[0])
	}
	return Workload{Space: seg[1], Actor: seg[3], ActorUID: cert.Subject.SerialNumber}, nil
}

// IssueNodeCertificate signs the certificate of node for the key of csr:
// it authenticates the node agent both as a client (to the control plane)
// and as a server (to the control plane calling it).
func (a *Authority) IssueNodeCertificate(node string, csr []byte) (*Issued, error) {
	if err := validate.Name("node", node); err != nil {
		return nil, err
	}
	pub, err := csrKey(csr)
	if err != nil {
		return nil, err
	}
	return a.issueNode(node, pub)
}

func (a *Authority) issueNode(node string, pub crypto.PublicKey) (*Issued, error) {
	return a.issue(pub, &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{"torpor"}, CommonName: node},
		URIs:        []*url.URL{spiffeURL(a.cfg.TrustDomain, "node", node)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}, a.cfg.MemberCertTTL)
}

// IssueWorkloadCertificate signs the certificate of actor w for the key of
// csr. Only call it for a workload AuthorizeWorkload granted.
func (a *Authority) IssueWorkloadCertificate(w Workload, csr []byte) (*Issued, error) {
	pub, err := csrKey(csr)
	if err != nil {
		return nil, err
	}
	return a.issue(pub, &x509.Certificate{
		Subject: pkix.Name{
			Organization:       []string{"torpor"},
			OrganizationalUnit: []string{w.Space},
			CommonName:         w.Actor,
			SerialNumber:       w.ActorUID,
		},
		URIs:        []*url.URL{spiffeURL(a.cfg.TrustDomain, "space", w.Space, "actor", w.Actor)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}, a.cfg.WorkloadCertTTL)
}

// ServerCertificate makes a key in this process and a certificate for it
// naming the replica (ServerID) and hosts (DNS names or IP addresses).
// Control plane replicas serve with it and present it to node agents.
func (a *Authority) ServerCertificate(hosts []string) (tls.Certificate, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{"torpor"}, CommonName: "torpor server"},
		URIs:        []*url.URL{spiffeURL(a.cfg.TrustDomain, "server")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for i, h := range hosts {
		switch ip := net.ParseIP(h); {
		case ip != nil:
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		case h == "":
			return tls.Certificate{}, fmt.Errorf("server certificate: hosts[%d] is empty", i)
		default:
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	issued, err := a.issue(key.Public(), tmpl, a.cfg.ServerCertTTL)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: issued.Chain, PrivateKey: key, Leaf: issued.Certificate}, nil
}

// IssueIngressCertificate signs router's serving certificate for the key
// of csr: the DNS names *.<domain> and <domain>, where E2B sandboxes are
// reached (<port>-<id>.<domain>), and the loopback names (localhost, 127.0.0.1,
// ::1), for clients on the router's host that address it directly (the
// E2B SDK's E2B_SANDBOX_URL). It serves only: no client may authenticate
// with it. The caller checks that router may serve domain.
func (a *Authority) IssueIngressCertificate(router, domain string, csr []byte) (*Issued, error) {
	if err := validate.Name("router", router); err != nil {
		return nil, err
	}
	for label := range strings.SplitSeq(domain, ".") {
		if err := validate.Name("domain", label); err != nil {
			return nil, err
		}
	}
	pub, err := csrKey(csr)
	if err != nil {
		return nil, err
	}
	return a.issue(pub, &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{"torpor"}, CommonName: "*." + domain},
		URIs:        []*url.URL{spiffeURL(a.cfg.TrustDomain, "ingress", router)},
		DNSNames:    []string{"*." + domain, domain, "localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, a.cfg.ServerCertTTL)
}

func (a *Authority) issue(pub crypto.PublicKey, tmpl *x509.Certificate, ttl time.Duration) (*Issued, error) {
	now := a.cfg.Now()
	tmpl.SerialNumber = randomSerial()
	tmpl.NotBefore = now.Add(-backdate)
	tmpl.NotAfter = now.Add(ttl)
	if tmpl.NotAfter.After(a.ca.NotAfter) {
		tmpl.NotAfter = a.ca.NotAfter
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	if _, isRSA := pub.(*rsa.PublicKey); isRSA {
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.ca, pub, a.caKey)
	if err != nil {
		return nil, fmt.Errorf("sign certificate for %s: %w", tmpl.URIs[0], err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Issued{Certificate: cert, Chain: [][]byte{der, a.ca.Raw}, SPIFFEID: tmpl.URIs[0].String()}, nil
}

// csrKey checks a DER certificate request (its signature proves the caller
// holds the key) and returns its public key. Everything else in it is
// ignored: the CA decides what a certificate says.
func csrKey(der []byte) (crypto.PublicKey, error) {
	if len(der) == 0 {
		return nil, &validate.FieldError{Path: "csr", Reason: "required (a DER PKCS#10 certificate request)"}
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, &validate.FieldError{Path: "csr", Reason: fmt.Sprintf("not a DER PKCS#10 certificate request: %v", err)}
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, &validate.FieldError{Path: "csr", Reason: fmt.Sprintf("signature does not verify: %v", err)}
	}
	if err := checkKey(csr.PublicKey); err != nil {
		return nil, &validate.FieldError{Path: "csr", Reason: err.Error()}
	}
	return csr.PublicKey, nil
}

func checkKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return fmt.Errorf("ECDSA curve %s is not accepted (P-256 or P-384)", k.Curve.Params().Name)
		}
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Errorf("RSA key of %d bits is too short (at least 2048)", k.N.BitLen())
		}
	case ed25519.PublicKey:
	default:
		return fmt.Errorf("key type %T is not accepted (ECDSA, RSA or Ed25519)", pub)
	}
	return nil
}

// NewCSR makes an ECDSA P-256 key and a certificate request for it: what a
// node (for itself or for a workload) sends to be certified.
func NewCSR() (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate request: %w", err)
	}
	return key, csr, nil
}

// TLSCertificate pairs key with an issued DER chain (certificate first).
func TLSCertificate(key crypto.Signer, chain [][]byte) (tls.Certificate, error) {
	if len(chain) == 0 {
		return tls.Certificate{}, errors.New("tls certificate: empty chain")
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tls certificate: %w", err)
	}
	if pub, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(key.Public()) {
		return tls.Certificate{}, fmt.Errorf("tls certificate %v: the key does not belong to it", leaf.URIs)
	}
	return tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, nil
}

// CertPool parses DER CA certificates (a trust bundle).
func CertPool(bundle [][]byte) (*x509.CertPool, error) {
	if len(bundle) == 0 {
		return nil, errors.New("trust bundle is empty")
	}
	pool := x509.NewCertPool()
	for i, der := range bundle {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("trust bundle[%d]: %w", i, err)
		}
		pool.AddCert(cert)
	}
	return pool, nil
}
