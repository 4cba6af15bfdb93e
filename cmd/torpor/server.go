package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/cli"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/router"
	"github.com/torpor-dev/torpor/internal/server"
	"github.com/torpor-dev/torpor/internal/workflow"
)

func init() { register(newServerCommand) }

func newServerCommand() *cobra.Command {
	var opts server.Options
	var images imageFlags
	var logs logFlags
	var traces traceFlags
	var kubernetes kubeFlags
	cmd := &cobra.Command{
		Use:     "server",
		Example: "  torpor server --store postgres://torpor@db/torpor --snapshots s3://torpor-snapshots --listen 0.0.0.0:7070",
		Short:   "Run the control plane API (any number of replicas may share a PostgreSQL store)",
		Long: `Run the control plane API over TLS (HTTP/2 and HTTP/1.1), with a certificate
from the installation's CA, which the first server creates in the store.

Every API call needs a credential: the admin token, an API token (torpor
token create --spaces ...) or, for node agents, their node certificate. The
server writes the admin token (mode 0600) and the CA certificate clients
verify it with to --admin-token-file and --ca-file on every start:

  torpor --server https://HOST:7070 --ca <data dir>/ca.pem --token "$(cat <data dir>/admin-token)" actor list

or put server, ca and token in the client config file
($XDG_CONFIG_HOME/torpor/config.yaml), as torpor up does.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The single-machine defaults live together in the data dir.
			dir, err := cli.DataDir()
			if err != nil {
				return err
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return fmt.Errorf("create data directory: %w", err)
			}
			for _, d := range []struct {
				value *string
				def   string
			}{
				{&opts.Store, "sqlite:" + filepath.Join(dir, "torpor.db")},
				{&opts.Snapshots, filepath.Join(dir, "snapshots")},
				{&opts.AdminTokenFile, filepath.Join(dir, "admin-token")},
				{&opts.CAFile, filepath.Join(dir, "ca.pem")},
			} {
				if *d.value == "" {
					*d.value = d.def
				}
			}
			if opts.Images, err = images.policy(dir); err != nil {
				return err
			}
			if opts.Logger, err = logs.logger(cmd.ErrOrStderr()); err != nil {
				return err
			}
			if opts.Kubernetes, err = kubernetes.cluster(); err != nil {
				return err
			}
			stop, err := traces.start("torpor-server", opts.Logger)
			if err != nil {
				return err
			}
			defer stop()
			return server.Run(cmd.Context(), opts)
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&opts.Listen, "listen", "127.0.0.1:7070", "address to serve the API on (HTTPS)")
	flags.StringVar(&opts.Snapshots, "snapshots", "", "snapshot storage shared with the nodes: a directory, or s3://BUCKET[/PREFIX][?endpoint=HOST:PORT&region=R&insecure=true] with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (default <data dir>/snapshots)")
	flags.DurationVar(&opts.HeartbeatTimeout, "heartbeat-timeout", workflow.DefaultHeartbeatTimeout, "a node silent for longer is lost and its actors crash")
	flags.DurationVar(&opts.RecoverAfter, "recover-after", workflow.DefaultRecoverAfter, "re-drive workflow steps in flight for longer than this")
	flags.StringVar(&opts.Store, "store", "", "store: sqlite:PATH or postgres://... (default sqlite:<data dir>/torpor.db, data dir $XDG_DATA_HOME/torpor or ~/.local/share/torpor)")
	flags.StringVar(&opts.TrustDomain, "trust-domain", identity.DefaultTrustDomain, "trust domain of the SPIFFE IDs the CA issues (fixed when the CA is created)")
	flags.StringVar(&opts.Issuer, "issuer", "", "iss of workload JWTs, the URL verifiers find /.well-known/jwks.json under (default https://<listen>)")
	flags.StringSliceVar(&opts.TLSNames, "tls-san", nil, "more DNS names or IP addresses for the server certificate (it always has the listen host, 127.0.0.1 and localhost)")
	flags.StringSliceVar(&opts.IngressDomains, "ingress-domain", []string{router.DefaultDomain}, "domains routers may get HTTPS certificates for (*.<domain> and <domain>, from the CA): their --domain")
	flags.DurationVar(&opts.MemberCertTTL, "member-cert-ttl", identity.DefaultMemberCertTTL, "lifetime of node and API client certificates (they renew at two thirds of it)")
	flags.StringVar(&opts.AdminTokenFile, "admin-token-file", "", "where to write the admin token (default <data dir>/admin-token)")
	flags.StringVar(&opts.CAFile, "ca-file", "", "where to write the CA certificate clients verify the server with (default <data dir>/ca.pem)")
	flags.StringVar(&opts.E2BListen, "e2b-listen", "", "address to serve the E2B-compatible API on in plain HTTP (docs/e2b.md); empty: none (the API port serves it under /sandboxes and /v2/sandboxes, over HTTPS)")
	flags.StringVar(&opts.E2BDomain, "e2b-domain", "", "domain the E2B API answers the SDK with: the routers' domain (a port may follow), sandbox ports being <port>-<id>.<domain>; empty: none, the SDK uses its E2B_DOMAIN")
	flags.IntVar(&opts.NodeMemoryFloor, "node-memory-floor", workflow.DefaultNodeMemoryFloor, "percent of a node's memory below which its frozen actors (idlePolicy.freezeSeconds) are paused or suspended, least recently active first; 0: never")
	flags.StringToIntVar(&opts.Headroom, "headroom", nil, "per worker pool, workers to keep free by evicting idle actors early, so a resume rarely waits for an eviction (POOL=N,...)")
	images.register(flags)
	kubernetes.register(flags)
	logs.register(cmd.PersistentFlags(), "info")
	traces.register(cmd.PersistentFlags())
	return cmd
}
