package flagconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

type settings struct {
	listen   string
	timeout  time.Duration
	workers  int
	egress   bool
	store    string
	sans     []string
	headroom map[string]int
	config   string
}

func flagSet(s *settings) *pflag.FlagSet {
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	fs.StringVar(&s.listen, "listen", "127.0.0.1:7070", "")
	fs.DurationVar(&s.timeout, "heartbeat-timeout", 15*time.Second, "")
	fs.IntVar(&s.workers, "workers", 2, "")
	fs.BoolVar(&s.egress, "egress", true, "")
	fs.StringVar(&s.store, "store", "", "")
	fs.StringArrayVar(&s.sans, "tls-san", nil, "")
	fs.StringToIntVar(&s.headroom, "headroom", nil, "")
	fs.StringVar(&s.config, ConfigFlag, "", "")
	return fs
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func write(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPrecedence: a flag wins over its environment variable, which wins
// over the config file's command section, which wins over its top level;
// what nothing sets keeps its default.
func TestPrecedence(t *testing.T) {
	config := write(t, "torpor.yaml", `
listen: file:1
workers: 3
heartbeat-timeout: 40s
egress: false
tls-san: [a.example, b.example]
headroom: {default: 2, big: 1}
server:
  workers: 5
router:
  listen: router-only:1
`)
	var s settings
	fs := flagSet(&s)
	if err := fs.Parse([]string{"--listen", "flag:1", "--config", config}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, "server", []string{"server", "router"}, env(map[string]string{"TORPOR_LISTEN": "env:1", "TORPOR_HEARTBEAT_TIMEOUT": "20s"})); err != nil {
		t.Fatal(err)
	}
	if s.listen != "flag:1" || s.timeout != 20*time.Second || s.workers != 5 || s.egress ||
		strings.Join(s.sans, ",") != "a.example,b.example" || s.headroom["default"] != 2 || s.headroom["big"] != 1 || s.store != "" {
		t.Errorf("got %+v", s)
	}
}

// TestEnvironment: TORPOR_CONFIG names the file; list variables split at
// commas; a _FILE variable reads a secret from a file.
func TestEnvironment(t *testing.T) {
	config := write(t, "torpor.yaml", "workers: 7\n")
	secret := write(t, "db", "postgres://u:secret@db/torpor\n")
	var s settings
	fs := flagSet(&s)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	err := Apply(fs, "server", nil, env(map[string]string{"TORPOR_CONFIG": config, "TORPOR_TLS_SAN": "x,y", "TORPOR_STORE_FILE": secret}))
	if err != nil {
		t.Fatal(err)
	}
	if s.workers != 7 || strings.Join(s.sans, ",") != "x,y" || s.store != "postgres://u:secret@db/torpor" {
		t.Errorf("got %+v", s)
	}
}

func TestSecretFromConfigKey(t *testing.T) {
	secret := write(t, "db", "postgres://u:secret@db/torpor")
	config := write(t, "torpor.yaml", "store-file: "+secret+"\n")
	var s settings
	fs := flagSet(&s)
	if err := fs.Parse([]string{"--config", config}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, "server", nil, env(nil)); err != nil || s.store != "postgres://u:secret@db/torpor" {
		t.Errorf("store %q, %v", s.store, err)
	}
}

// TestErrors: each refusal names the variable or the file, line and key.
func TestErrors(t *testing.T) {
	for _, tt := range []struct {
		name, config string
		env          map[string]string
		want         []string
	}{
		{name: "unknown key", config: "lisen: x\n", want: []string{"torpor.yaml:1: lisen: unknown setting"}},
		{name: "unknown key in the command's section", config: "server:\n  workers: 1\n  wrokers: 2\n", want: []string{"torpor.yaml:3: wrokers: unknown setting"}},
		{name: "bad value in the file", config: "\nheartbeat-timeout: soon\n", want: []string{"torpor.yaml:2: heartbeat-timeout", `"soon" is not a valid --heartbeat-timeout`}},
		{name: "bad value in the environment", env: map[string]string{"TORPOR_WORKERS": "many"}, want: []string{"TORPOR_WORKERS", `"many" is not a valid --workers`}},
		{name: "both a value and a file", env: map[string]string{"TORPOR_STORE": "a", "TORPOR_STORE_FILE": "b"}, want: []string{"TORPOR_STORE and TORPOR_STORE_FILE: give one"}},
		{name: "missing secret file", env: map[string]string{"TORPOR_STORE_FILE": "/nonexistent/db"}, want: []string{"TORPOR_STORE_FILE", "/nonexistent/db"}},
		{name: "missing config file", env: map[string]string{"TORPOR_CONFIG": "/nonexistent/torpor.yaml"}, want: []string{"config file", "/nonexistent/torpor.yaml"}},
		{name: "not a mapping", config: "- listen\n", want: []string{"torpor.yaml:1: want a mapping"}},
		{name: "nested value", config: "listen: {a: {b: c}}\n", want: []string{"torpor.yaml:1: listen", "KEY: VALUE pairs"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var s settings
			fs := flagSet(&s)
			var args []string
			if tt.config != "" {
				args = []string{"--config", write(t, "torpor.yaml", tt.config)}
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			err := Apply(fs, "server", []string{"server", "router"}, env(tt.env))
			if err == nil {
				t.Fatalf("no error, want one naming %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

// TestOwnFileFlag: TORPOR_CA_FILE belongs to --ca-file where there is
// one, not to a --ca read from a file.
func TestOwnFileFlag(t *testing.T) {
	fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
	ca := fs.String("ca", "", "")
	caFile := fs.String("ca-file", "", "")
	if err := Apply(fs, "server", nil, env(map[string]string{"TORPOR_CA_FILE": "/etc/torpor/ca.pem"})); err != nil {
		t.Fatal(err)
	}
	if *caFile != "/etc/torpor/ca.pem" || *ca != "" {
		t.Errorf("--ca-file %q, --ca %q", *caFile, *ca)
	}
}

// TestAlternatives: of flags that give one setting, the strongest source
// wins (an explicit flag over an alternative's variable, a variable over
// an alternative's config key), and two from the same source are refused
// naming both as the user gave them.
func TestAlternatives(t *testing.T) {
	config := write(t, "torpor.yaml", "ca-fingerprint: sha256:file\n")
	unreadable := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name           string
		args           []string
		env            map[string]string
		wantCA, wantFP string
		wantErr        []string
		wantErrAbsent  string
	}{
		{name: "flag over an alternative's variable", args: []string{"--ca-fingerprint", "sha256:flag"}, env: map[string]string{"TORPOR_CA": "/ca.pem"}, wantFP: "sha256:flag"},
		{name: "flag over an alternative's unreadable _FILE", args: []string{"--ca", "/flag.pem"}, env: map[string]string{"TORPOR_CA_FINGERPRINT_FILE": unreadable}, wantCA: "/flag.pem"},
		{name: "variable over an alternative's config key", args: []string{"--config", config}, env: map[string]string{"TORPOR_CA": "/env.pem"}, wantCA: "/env.pem"},
		{name: "config key alone", args: []string{"--config", config}, wantFP: "sha256:file"},
		{name: "one variable", env: map[string]string{"TORPOR_CA_FINGERPRINT": "sha256:env"}, wantFP: "sha256:env"},
		{name: "two variables", env: map[string]string{"TORPOR_CA": "/ca.pem", "TORPOR_CA_FINGERPRINT": "sha256:env"}, wantErr: []string{"TORPOR_CA and TORPOR_CA_FINGERPRINT: give one"}},
		{name: "two flags", args: []string{"--ca", "/ca.pem", "--ca-fingerprint", "sha256:flag"}, wantErr: []string{"--ca and --ca-fingerprint: give one"}},
		{name: "variable and a config key of the other, with its flag given", args: []string{"--config", config, "--ca", "/ca.pem"}, env: map[string]string{"TORPOR_CA_FINGERPRINT": "sha256:env"}, wantCA: "/ca.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ca, fp, cfg string
			fs := pflag.NewFlagSet("node", pflag.ContinueOnError)
			fs.StringVar(&ca, "ca", "", "")
			fs.StringVar(&fp, "ca-fingerprint", "", "")
			fs.StringVar(&cfg, ConfigFlag, "", "")
			Alternatives(fs, "ca", "ca-fingerprint")
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			err := Apply(fs, "node", []string{"node"}, env(tt.env))
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("no error; --ca %q, --ca-fingerprint %q", ca, fp)
				}
				for _, want := range tt.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q, want it to say %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ca != tt.wantCA || fp != tt.wantFP {
				t.Errorf("--ca %q, --ca-fingerprint %q; want %q, %q", ca, fp, tt.wantCA, tt.wantFP)
			}
		})
	}
}
