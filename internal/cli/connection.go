package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/identity"
)

// Environment variables a client reads when no flag says otherwise.
const (
	envServer = "TORPOR_SERVER"
	envCA     = "TORPOR_CA"
	envToken  = "TORPOR_TOKEN"
)

// Connection is how a client reaches the API: the server's base URL, the
// CA its certificate must chain to and the API token to authenticate with.
type Connection struct {
	Server string
	// CA is PEM; empty trusts the system's roots.
	CA []byte
	// Token is sent as "Authorization: Bearer <token>", over TLS only.
	Token string
	// Client, with its certificate file Credentials, authenticates calls
	// when there is no Token (torpor login).
	Client      string
	Credentials string
}

// ResolveConnection finds the API the way every client does (the CLI, the
// router). Each setting comes from its flag, else its environment variable
// (TORPOR_SERVER, TORPOR_CA naming a file, TORPOR_TOKEN), else the client
// config file; the server defaults to the local one. A bare host:port, as
// --listen takes it, gets https://.
func ResolveConnection(serverFlag, caFlag, tokenFlag string) (Connection, error) {
	cfg, cfgDir, err := readDefaultConfig()
	if err != nil {
		return Connection{}, err
	}
	c := Connection{
		Server: firstSet(serverFlag, os.Getenv(envServer), cfg.Server, defaultServer),
		Token:  firstSet(tokenFlag, os.Getenv(envToken), cfg.Token),
	}
	if c.Token == "" && cfg.Client != "" {
		c.Client, c.Credentials = cfg.Client, cfg.Credentials
		if !filepath.IsAbs(c.Credentials) {
			c.Credentials = filepath.Join(cfgDir, c.Credentials)
		}
	}
	if !strings.Contains(c.Server, "://") {
		c.Server = "https://" + c.Server
	}
	c.Server = strings.TrimSuffix(c.Server, "/")
	switch caFile := firstSet(caFlag, os.Getenv(envCA)); {
	case caFile != "":
		if c.CA, err = os.ReadFile(caFile); err != nil {
			return Connection{}, fmt.Errorf("--ca: %w", err)
		}
	case cfg.CA != "":
		if c.CA, err = cfg.caPEM(cfgDir); err != nil {
			return Connection{}, err
		}
	}
	return c, nil
}

func firstSet(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

// readDefaultConfig reads the client config file, if there is one, and
// returns it with its directory.
func readDefaultConfig() (ClientConfig, string, error) {
	path, err := ConfigPath()
	if err != nil {
		return ClientConfig{}, "", nil // no config directory: no config
	}
	cfg, err := ReadClientConfig(path)
	if errors.Is(err, fs.ErrNotExist) {
		return ClientConfig{}, "", nil
	}
	return cfg, filepath.Dir(path), err
}

// caPEM is the config's CA: PEM itself, or a file (relative to the config
// file's directory).
func (c ClientConfig) caPEM(dir string) ([]byte, error) {
	if strings.HasPrefix(strings.TrimSpace(c.CA), "-----BEGIN") {
		return []byte(c.CA), nil
	}
	path := c.CA
	if !filepath.IsAbs(path) {
		path = filepath.Join(dir, path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("client config: ca: %w", err)
	}
	return data, nil
}

// HTTPClient calls the API over c: TLS 1.3 verified against c.CA, with
// the token on every request, or else the client certificate (renewed
// first when it is due).
func (c Connection) HTTPClient() (*http.Client, error) {
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS13}
	if len(c.CA) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(c.CA) {
			return nil, errors.New("ca: no PEM certificate in it")
		}
		tlsConfig.RootCAs = pool
	}
	if c.Token == "" && c.Client != "" {
		cert, err := c.clientCertificate()
		if err != nil {
			return nil, err
		}
		tlsConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert.Certificate(), nil }
	}
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     tlsConfig,
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
	}
	if c.Token == "" {
		return &http.Client{Transport: transport}, nil
	}
	return &http.Client{Transport: bearer{token: c.Token, next: transport}}, nil
}

// bearer authenticates every request with an API token, and refuses to
// send it in the clear.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != "https" {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, fmt.Errorf("refusing to send the API token to %s over plain HTTP: use an https:// server URL", r.URL.Host)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// clientCertificate loads the logged-in client's certificate, renewing it
// when two thirds of its life have passed.
func (c Connection) clientCertificate() (*identity.Keypair, error) {
	m := c.member()
	creds, err := m.LoadCredentials()
	if err != nil {
		return nil, fmt.Errorf("client %s: %w (log in again: torpor login)", c.Client, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), identity.DefaultCallTimeout)
	defer cancel()
	if err := m.RenewIfDue(ctx, creds); err != nil {
		return nil, err
	}
	return creds.Keypair(), nil
}

// member is the logged-in client as a member of the installation.
func (c Connection) member() *identity.Member {
	return &identity.Member{
		Kind: identity.MemberClient, Name: c.Client, ServerURL: c.Server, File: c.Credentials,
		Logger: slog.New(slog.DiscardHandler),
	}
}
