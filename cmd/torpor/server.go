package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/cli"
	"github.com/torpor-dev/torpor/internal/server"
)

func init() { register(newServerCommand) }

func newServerCommand() *cobra.Command {
	var opts server.Options
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the control plane API (any number of replicas may share a PostgreSQL store)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Store == "" || opts.Snapshots == "" {
				// The single-machine defaults live together in the data dir.
				dir, err := cli.DataDir()
				if err != nil {
					return err
				}
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return fmt.Errorf("create data directory: %w", err)
				}
				if opts.Store == "" {
					opts.Store = "sqlite:" + filepath.Join(dir, "torpor.db")
				}
				if opts.Snapshots == "" {
					opts.Snapshots = filepath.Join(dir, "snapshots")
				}
			}
			opts.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			return server.Run(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Listen, "listen", "127.0.0.1:7070", "address to serve the API on")
	cmd.Flags().StringVar(&opts.Snapshots, "snapshots", "", "snapshot storage directory, shared with the nodes (default <data dir>/snapshots)")
	cmd.Flags().DurationVar(&opts.HeartbeatTimeout, "heartbeat-timeout", 15*time.Second, "a node silent for longer is lost and its actors crash")
	cmd.Flags().DurationVar(&opts.RecoverAfter, "recover-after", 2*time.Minute, "re-drive workflow steps in flight for longer than this")
	cmd.Flags().StringVar(&opts.Store, "store", "", "store: sqlite:PATH or postgres://... (default sqlite:<data dir>/torpor.db, data dir $XDG_DATA_HOME/torpor or ~/.local/share/torpor)")
	return cmd
}
