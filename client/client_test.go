package client

import (
	"cmp"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testCA = "-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIBATAKBggqhkjOPQQDAjAAMB4XDTI2MDEwMTAwMDAwMFoX\n-----END CERTIFICATE-----\n"

func TestDiscover(t *testing.T) {
	tests := []struct {
		name                     string
		serverFlag, caFlag, tok  string
		routerFlag, wantRouter   string // wantRouter "": DefaultRouter
		env                      map[string]string
		config                   string // client config file contents; "" writes none
		files                    map[string]string
		wantServer, wantCA, want string // want: the token
	}{
		{name: "default", wantServer: DefaultServer},
		{name: "flag host:port", serverFlag: "127.0.0.1:9000", env: map[string]string{EnvServer: "https://env:1"}, wantServer: "https://127.0.0.1:9000"},
		{name: "flag URL with slash", serverFlag: "https://api.example/", wantServer: "https://api.example"},
		{name: "environment", env: map[string]string{EnvServer: "env.example:7070", EnvToken: "env-token"}, config: "server: https://file:1\ntoken: file-token\n",
			wantServer: "https://env.example:7070", want: "env-token"},
		{name: "config file", config: "server: https://file.example:7070/\ntoken: file-token\nca: |\n  " + strings.ReplaceAll(strings.TrimSpace(testCA), "\n", "\n  ") + "\n",
			wantServer: "https://file.example:7070", want: "file-token", wantCA: testCA},
		{name: "config CA file relative to the config", config: "ca: ca.pem\n", files: map[string]string{"torpor/ca.pem": testCA},
			wantServer: DefaultServer, wantCA: testCA},
		{name: "flags win", serverFlag: "https://flag", caFlag: "flag-ca.pem", tok: "flag-token", files: map[string]string{"flag-ca.pem": testCA},
			env: map[string]string{EnvToken: "env-token", EnvCA: "/nonexistent"}, config: "token: file-token\nca: /nonexistent\n",
			wantServer: "https://flag", want: "flag-token", wantCA: testCA},
		{name: "router from the config file", config: "router: http://127.0.0.1:9080\n", wantServer: DefaultServer, wantRouter: "http://127.0.0.1:9080"},
		{name: "router from the environment", env: map[string]string{EnvRouter: "http://env:1"}, config: "router: http://file:1\n", wantServer: DefaultServer, wantRouter: "http://env:1"},
		{name: "router flag wins", routerFlag: "http://flag:1", env: map[string]string{EnvRouter: "http://env:1"}, config: "router: http://file:1\n", wantServer: DefaultServer, wantRouter: "http://flag:1"},
		{name: "CA from the environment", env: map[string]string{EnvCA: "env-ca.pem"}, files: map[string]string{"env-ca.pem": testCA}, config: "ca: /nonexistent\n",
			wantServer: DefaultServer, wantCA: testCA},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Chdir(dir)
			t.Setenv("XDG_CONFIG_HOME", dir)
			for _, k := range []string{EnvServer, EnvCA, EnvToken, EnvRouter} {
				t.Setenv(k, tt.env[k])
			}
			for name, content := range tt.files {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tt.config != "" {
				path := filepath.Join(dir, "torpor", "config.yaml")
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(tt.config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := Discover(Options{Server: tt.serverFlag, CAFile: tt.caFlag, Token: tt.tok, Router: tt.routerFlag})
			if err != nil {
				t.Fatal(err)
			}
			if got.Server != tt.wantServer || got.Token != tt.want || strings.TrimSpace(string(got.CA)) != strings.TrimSpace(tt.wantCA) {
				t.Fatalf("got server %q token %q CA %q; want %q %q %q", got.Server, got.Token, got.CA, tt.wantServer, tt.want, tt.wantCA)
			}
			if want := cmp.Or(tt.wantRouter, DefaultRouter); got.Router != want {
				t.Errorf("router %q, want %q", got.Router, want)
			}
		})
	}
}

// isolate keeps a test away from the user's environment and config file.
func isolate(t *testing.T) {
	t.Helper()
	for _, k := range []string{EnvServer, EnvCA, EnvToken, EnvRouter} {
		t.Setenv(k, "")
	}
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
}

func TestDiscoverErrors(t *testing.T) {
	isolate(t)
	if _, err := Discover(Options{CAFile: "/nonexistent/ca.pem"}); err == nil || !strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Errorf("missing CA file: %v, want an error naming it", err)
	}
	if _, err := (Connection{Server: DefaultServer, CA: []byte("not PEM")}).HTTPClient(); err == nil || !strings.Contains(err.Error(), "ca") {
		t.Errorf("CA that is not PEM: %v, want an error naming ca", err)
	}
}

func TestConfigFile(t *testing.T) {
	isolate(t)
	got, err := Discover(Options{})
	if err != nil || got.Server != DefaultServer {
		t.Errorf("server without config = %q, %v; want %q", got.Server, err, DefaultServer)
	}
	path, err := ConfigPath()
	if err != nil {
		t.Fatal(err)
	}
	written := Config{Server: "https://10.1.2.3:7070", CA: testCA, Token: "torpor-secret"}
	if err := WriteConfig(path, written); err != nil {
		t.Fatal(err)
	}
	if cfg, err := ReadConfig(path); err != nil || cfg != written {
		t.Errorf("read back %+v, %v; wrote %+v", cfg, err, written)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("config file with a token: %v (%v), want mode 0600", fi.Mode(), err)
	}
	other := filepath.Join(t.TempDir(), "other.yaml")
	if err := WriteConfig(other, Config{Server: "https://other:1", Token: "other-token"}); err != nil {
		t.Fatal(err)
	}
	if got, err := Discover(Options{ConfigFile: other}); err != nil || got.Server != "https://other:1" || got.Token != "other-token" {
		t.Errorf("Options.ConfigFile: %+v, %v", got, err)
	}
}

// TestTokenNeverInTheClear: a token is not sent to an http:// server.
func TestTokenNeverInTheClear(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
	}))
	t.Cleanup(srv.Close)
	hc, err := Connection{Server: srv.URL, Token: "torpor-secret"}.HTTPClient()
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL, nil)
	if _, err := hc.Do(req); err == nil || !strings.Contains(err.Error(), "plain HTTP") {
		t.Errorf("request over http with a token: %v, want a refusal", err)
	}
	if len(got) != 0 {
		t.Errorf("the server received %v", got)
	}
}
