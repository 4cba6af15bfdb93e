package cli

import (
	"os"
	"path/filepath"
	"testing"
)

func TestServerURL(t *testing.T) {
	tests := []struct {
		name   string
		flag   string
		env    string
		config string // client config file contents; "" writes none
		want   string
	}{
		{name: "default", want: defaultServer},
		{name: "flag host:port", flag: "127.0.0.1:9000", env: "http://env:1", want: "http://127.0.0.1:9000"},
		{name: "flag URL with slash", flag: "https://api.example/", want: "https://api.example"},
		{name: "environment", env: "env.example:7070", config: "server: http://file:1\n", want: "http://env.example:7070"},
		{name: "config file", config: "server: http://file.example:7070/\n", want: "http://file.example:7070"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("XDG_CONFIG_HOME", dir)
			t.Setenv("TORPOR_SERVER", tt.env)
			if tt.config != "" {
				path := filepath.Join(dir, "torpor", "config.yaml")
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(tt.config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ServerURL(tt.flag)
			if err != nil || got != tt.want {
				t.Fatalf("ServerURL(%q) = %q, %v; want %q", tt.flag, got, err, tt.want)
			}
		})
	}
}
