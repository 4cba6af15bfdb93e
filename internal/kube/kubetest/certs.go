package kubetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the test cluster's key material, written as PEM files into one
// directory: a CA that signs the API server's serving certificate and the
// admin's client certificate (and that the API server trusts for client
// certificates), and the key that signs ServiceAccount tokens.
type pki struct {
	caFile                          string
	caPEM                           []byte
	servingCertFile, servingKeyFile string
	adminCertPEM, adminKeyPEM       []byte
	serviceAccountKeyFile           string
}

// The admin's identity: system:masters is bound to cluster-admin by the
// API server's bootstrap RBAC policy.
const (
	adminUser  = "torpor-test-admin"
	adminGroup = "system:masters"
)

// newPKI writes a fresh CA and the certificates and keys made with it
// into dir.
func newPKI(dir string) (*pki, error) {
	caKey, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "torpor kubetest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("create the test CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("parse the test CA: %w", err)
	}
	issue := func(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
		key, err := newKey()
		if err != nil {
			return nil, nil, err
		}
		tmpl.SerialNumber = serial()
		tmpl.NotBefore, tmpl.NotAfter = ca.NotBefore, ca.NotAfter
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
		if err != nil {
			return nil, nil, fmt.Errorf("issue the certificate of %q: %w", tmpl.Subject.CommonName, err)
		}
		keyPEM, err = encodeKey(key)
		return pemBlock("CERTIFICATE", der), keyPEM, err
	}

	servingCert, servingKey, err := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	})
	if err != nil {
		return nil, err
	}
	adminCert, adminKey, err := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: adminUser, Organization: []string{adminGroup}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	saKey, err := newKey()
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := encodeKey(saKey)
	if err != nil {
		return nil, err
	}

	p := &pki{
		caFile:                filepath.Join(dir, "ca.crt"),
		caPEM:                 pemBlock("CERTIFICATE", caDER),
		servingCertFile:       filepath.Join(dir, "apiserver.crt"),
		servingKeyFile:        filepath.Join(dir, "apiserver.key"),
		adminCertPEM:          adminCert,
		adminKeyPEM:           adminKey,
		serviceAccountKeyFile: filepath.Join(dir, "service-account.key"),
	}
	for file, data := range map[string][]byte{
		p.caFile:                p.caPEM,
		p.servingCertFile:       servingCert,
		p.servingKeyFile:        servingKey,
		p.serviceAccountKeyFile: saKeyPEM,
	} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", file, err)
		}
	}
	return p, nil
}

func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate a key: %w", err)
	}
	return key, nil
}

// encodeKey writes key as SEC 1 ("EC PRIVATE KEY"), the one encoding of
// an ECDSA key that kube-apiserver reads both as a signing key and as the
// key file it verifies tokens with.
func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode a key: %w", err)
	}
	return pemBlock("EC PRIVATE KEY", der), nil
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
