package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// defaultServer is where a client looks when nothing else names a server:
// the address `torpor server` and `torpor up` listen on by default.
const defaultServer = "http://127.0.0.1:7070"

// ClientConfig is the client's config file. `torpor up` writes it so later
// commands find the server it started without flags.
type ClientConfig struct {
	// Server is the API base URL, e.g. http://127.0.0.1:7070.
	Server string `json:"server"`
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

// DataDir is $XDG_DATA_HOME/torpor, or ~/.local/share/torpor when
// XDG_DATA_HOME is unset. It is where the single-machine defaults (SQLite
// database, local snapshots) live. It is not created here.
func DataDir() (string, error) {
	if dir := os.Getenv("XDG_DATA_HOME"); dir != "" {
		return filepath.Join(dir, "torpor"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("locate data directory: %w", err)
	}
	return filepath.Join(home, ".local", "share", "torpor"), nil
}

// ReadClientConfig reads a client config file. A missing file is reported
// with an error satisfying errors.Is(err, fs.ErrNotExist).
func ReadClientConfig(path string) (ClientConfig, error) {
	var cfg ClientConfig
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("read client config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return cfg, fmt.Errorf("client config %s: %w", path, err)
	}
	return cfg, nil
}

// WriteClientConfig writes cfg to path, creating its directory.
func WriteClientConfig(path string, cfg ClientConfig) error {
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encode client config: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create client config directory: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write client config: %w", err)
	}
	return nil
}

// serverURL picks the API address: the --server flag, then TORPOR_SERVER,
// then the client config file, then the local default.
func serverURL(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if env := os.Getenv("TORPOR_SERVER"); env != "" {
		return env, nil
	}
	path, err := ConfigPath()
	if err != nil {
		return defaultServer, nil
	}
	cfg, err := ReadClientConfig(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return defaultServer, nil
	case err != nil:
		return "", err
	case cfg.Server == "":
		return defaultServer, nil
	}
	return cfg.Server, nil
}
