package client

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"

	"github.com/torpor-dev/torpor/internal/atomicfile"
)

// DefaultServer is where a client looks when nothing else names a server:
// the address `torpor server` and `torpor up` listen on by default.
const DefaultServer = "https://127.0.0.1:7070"

// Config is the client config file. `torpor up` and `torpor login` write
// it so later clients find the server, and trust and authenticate to it,
// without flags.
type Config struct {
	// Server is the API base URL, e.g. https://127.0.0.1:7070.
	Server string `json:"server"`
	// CA is the CA certificate the server's certificate must chain to:
	// PEM, or the path of a PEM file (relative to this file's directory).
	// Empty trusts the system's roots.
	CA string `json:"ca,omitempty"`
	// Token is the API token calls authenticate with.
	Token string `json:"token,omitempty"`
	// Router is the base URL of the router TCP tunnels go through (torpor
	// actor port-forward), e.g. http://127.0.0.1:7080.
	Router string `json:"router,omitempty"`
	// Domain is the parent domain of actor host names at the router
	// (<actor>.<space>.<domain>), for the URLs the CLI shows. Default
	// DefaultDomain.
	Domain string `json:"domain,omitempty"`
	// Client and Credentials are the API client name and its certificate
	// file (relative to this file's directory), written by torpor login;
	// used when no token is set.
	Client      string `json:"client,omitempty"`
	Credentials string `json:"credentials,omitempty"`
}

// ConfigPath is $XDG_CONFIG_HOME/torpor/config.yaml, or
// ~/.config/torpor/config.yaml when XDG_CONFIG_HOME is unset.
func ConfigPath() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("locate config directory: %w", err)
	}
	return filepath.Join(dir, "torpor", "config.yaml"), nil
}

// ReadConfig reads a client config file. A missing file is reported with
// an error satisfying errors.Is(err, fs.ErrNotExist).
func ReadConfig(path string) (Config, error) {
	var cfg Config
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("read client config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return cfg, fmt.Errorf("client config %s: %w", path, err)
	}
	return cfg, nil
}

// WriteConfig writes cfg to path, creating its directory. The file may
// hold a token, so only its owner may read it.
func WriteConfig(path string, cfg Config) error {
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encode client config: %w", err)
	}
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("client config: %w", err)
	}
	return nil
}
