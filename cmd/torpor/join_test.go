package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/identity"
)

func TestJoinFlags(t *testing.T) {
	caFile, der := writeCA(t)
	fingerprint := identity.Fingerprint(der)
	notPEM := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(notPEM, []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "node-a")
	if err := os.WriteFile(tokenFile, []byte("torpor-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		flags     joinFlags
		env       string
		want      string // fingerprint after, or the error's text
		wantToken string
		wantErr   bool
	}{
		{name: "token and fingerprint", flags: joinFlags{token: "torpor-t", caFingerprint: fingerprint}, want: fingerprint, wantToken: "torpor-t"},
		{name: "token and CA file", flags: joinFlags{token: "torpor-t", caFile: caFile}, want: fingerprint, wantToken: "torpor-t"},
		{name: "token from the environment", env: "torpor-env", flags: joinFlags{caFingerprint: fingerprint}, want: fingerprint, wantToken: "torpor-env"},
		{name: "token from a file", flags: joinFlags{tokenFile: tokenFile, caFingerprint: fingerprint}, want: fingerprint, wantToken: "torpor-file"},
		{name: "the flag wins over the file", flags: joinFlags{token: "torpor-t", tokenFile: tokenFile, caFingerprint: fingerprint}, want: fingerprint, wantToken: "torpor-t"},
		{name: "missing token file: a restart on a saved certificate", flags: joinFlags{tokenFile: "/nonexistent/node-a", caFingerprint: fingerprint}, want: fingerprint},
		{name: "no token: a restart on a saved certificate", want: ""},
		{name: "token without a pin", flags: joinFlags{token: "torpor-t"}, want: "--ca-fingerprint", wantErr: true},
		{name: "CA file that is no PEM", flags: joinFlags{caFile: notPEM}, want: "no PEM CERTIFICATE", wantErr: true},
		{name: "missing CA file", flags: joinFlags{caFile: "/nonexistent.pem"}, want: "--ca", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("TORPOR_JOIN_TOKEN", tt.env)
			fingerprint, token, err := tt.flags.resolve()
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("error %v, want one containing %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fingerprint != tt.want {
				t.Errorf("fingerprint %q, want %q", fingerprint, tt.want)
			}
			if tt.wantToken == "" {
				if token != nil {
					t.Error("a join token function without a token")
				}
				return
			}
			if tok, err := token(context.Background()); err != nil || tok != tt.wantToken {
				t.Errorf("token %q (%v), want %q", tok, err, tt.wantToken)
			}
		})
	}
}

// writeCA writes a self-signed CA certificate as PEM and returns the file
// and the certificate's DER.
func writeCA(t *testing.T) (string, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, der
}
