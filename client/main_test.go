package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/server"
)

// TestMain runs the package's tests and examples against a real control
// plane (SQLite store), found through the client config file as torpor up
// leaves it.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "torpor-client-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	for k, v := range map[string]string{"XDG_CONFIG_HOME": filepath.Join(dir, "config"), client.EnvServer: "", client.EnvCA: "", client.EnvToken: ""} {
		os.Setenv(k, v)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cp, err := server.Start(context.Background(), server.Options{
		Listener: ln, Store: "sqlite:" + filepath.Join(dir, "torpor.db"), Snapshots: filepath.Join(dir, "snapshots"),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the control plane:", err)
		return 1
	}
	defer cp.Stop()
	path, err := client.ConfigPath()
	if err == nil {
		err = client.WriteConfig(path, client.Config{Server: cp.URL, CA: string(cp.CAPEM), Token: cp.AdminToken})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
