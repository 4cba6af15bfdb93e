// Package client connects Go programs to a Torpor API server. It finds
// the server, the CA the server's certificate chains to and the credential
// the way the torpor command line does (flags aside: Options stand in for
// them), and gives a connect client for each API service.
//
//	conn, err := client.Discover(client.Options{})
//	c, err := client.New(conn)
//	actors, err := c.Actors.ListActors(ctx, connect.NewRequest(&torporv1.ListRequest{Space: "default"}))
package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/identity"
)

// Environment variables Discover reads for settings Options leave empty.
const (
	EnvServer = "TORPOR_SERVER"
	EnvCA     = "TORPOR_CA"
	EnvToken  = "TORPOR_TOKEN"
)

// Options are what the caller says about the API; every empty field is
// discovered.
type Options struct {
	// Server is the API base URL, or a bare host:port (https:// is
	// added). Default: $TORPOR_SERVER, else the config file's server,
	// else DefaultServer.
	Server string
	// CAFile names the PEM file of the CA the server's certificate must
	// chain to. Default: $TORPOR_CA, else the config file's ca, else the
	// system's roots.
	CAFile string
	// Token is the API token. Default: $TORPOR_TOKEN, else the config
	// file's token, else the certificate of the client the config file
	// names (torpor login).
	Token string
	// Router is the router's base URL, for tunnels. Default:
	// $TORPOR_ROUTER, else the config file's router, else DefaultRouter.
	Router string
	// ConfigFile is the client config file. Default: ConfigPath(); a
	// missing file is no error.
	ConfigFile string
}

// Connection is how a client reaches the API: the server's base URL, the
// CA its certificate must chain to and the credential.
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
	// Router is the router's base URL, where Tunnel dials.
	Router string
	// Domain is the parent domain of actor host names at Router.
	Domain string
}

// Discover finds the API: each setting from opts, else its environment
// variable, else the client config file; the server defaults to the
// local one.
func Discover(opts Options) (Connection, error) {
	cfg, cfgDir, err := readConfigFile(opts.ConfigFile)
	if err != nil {
		return Connection{}, err
	}
	c := Connection{
		Server: firstSet(opts.Server, os.Getenv(EnvServer), cfg.Server, DefaultServer),
		Token:  firstSet(opts.Token, os.Getenv(EnvToken), cfg.Token),
		Router: firstSet(opts.Router, os.Getenv(EnvRouter), cfg.Router, DefaultRouter),
		Domain: firstSet(cfg.Domain, DefaultDomain),
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
	switch caFile := firstSet(opts.CAFile, os.Getenv(EnvCA)); {
	case caFile != "":
		if c.CA, err = os.ReadFile(caFile); err != nil {
			return Connection{}, fmt.Errorf("CA certificate: %w", err)
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

// readConfigFile reads the client config file (path, else the default
// one), if there is one, and returns it with its directory.
func readConfigFile(path string) (Config, string, error) {
	if path == "" {
		var err error
		if path, err = ConfigPath(); err != nil {
			return Config{}, "", nil // no config directory: no config
		}
	}
	cfg, err := ReadConfig(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Config{}, "", nil
	}
	return cfg, filepath.Dir(path), err
}

// caPEM is the config's CA: PEM itself, or a file (relative to the config
// file's directory).
func (c Config) caPEM(dir string) ([]byte, error) {
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
