package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/cli"
	"github.com/torpor-dev/torpor/internal/router"
	"github.com/torpor-dev/torpor/internal/server"
)

func init() { register(newRouterCommand) }

func newRouterCommand() *cobra.Command {
	var (
		cfg           router.Config
		listen        string
		metricsListen string
	)
	cmd := &cobra.Command{
		Use:   "router",
		Short: "Run the HTTP ingress: route requests to actors, resuming them on demand",
		Long: `Run the HTTP ingress. A request reaches actor <space>/<actor> by its host
name, <actor>.<space>.<domain> (any port), or by the header
Torpor-Actor: <space>/<actor>, which wins. An actor that is not running is
resumed first (one resume however many requests wait); while no worker is
free requests wait up to --park-timeout, then get 503 with Retry-After.
Actors whose template has an idle policy are paused or suspended after that
many seconds without traffic through this router.

Prometheus metrics are served at /metrics (with /healthz) on
--metrics-listen when it is set; otherwise on --listen, to requests that name
no actor (any other Host, no Torpor-Actor header), so they never shadow an
actor's own paths.

The control plane is found, trusted and authenticated to like the CLI does
it: --server, --ca and --token, then $TORPOR_SERVER, $TORPOR_CA and
$TORPOR_TOKEN, then the client config file (server defaults to
https://127.0.0.1:7070). The token must reach every space whose actors the
router serves: the admin token, or an API token for those spaces.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := cli.ResolveConnection(cmd.Flag("server").Value.String(), cmd.Flag("ca").Value.String(), cmd.Flag("token").Value.String())
			if err != nil {
				return err
			}
			if conn.Token == "" {
				return errors.New("the router needs an API token: --token, $TORPOR_TOKEN or token: in the client config file")
			}
			if cfg.HTTPClient, err = conn.HTTPClient(); err != nil {
				return err
			}
			cfg.Server = conn.Server
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			cfg.AdminOnIngress = metricsListen == ""
			return runRouter(cmd.Context(), cfg, listen, metricsListen)
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&listen, "listen", "127.0.0.1:7080", "address to serve actors' traffic on")
	flags.StringVar(&cfg.Domain, "domain", router.DefaultDomain, "parent domain of actor host names: <actor>.<space>.<domain>")
	flags.DurationVar(&cfg.ParkTimeout, "park-timeout", router.DefaultParkTimeout, "how long requests wait for a free worker before 503")
	flags.DurationVar(&cfg.ResumeTimeout, "resume-timeout", router.DefaultResumeTimeout, "how long requests wait for a resume before 504")
	flags.StringVar(&metricsListen, "metrics-listen", "", "separate address for /metrics and /healthz (default: on --listen, for requests naming no actor)")
	return cmd
}

// runRouter serves the router (and its metrics listener, if any) and applies
// idle policies until ctx is done; the first part to fail stops the rest.
func runRouter(ctx context.Context, cfg router.Config, listen, metricsListen string) error {
	rt, err := router.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", listen, err)
	}
	parts := map[string]func(context.Context) error{
		"router":      func(ctx context.Context) error { return server.Serve(ctx, ln, rt, nil) },
		"idle policy": func(ctx context.Context) error { return rt.Run(ctx) },
	}
	logAttrs := []any{"listen", ln.Addr().String(), "server", cfg.Server, "domain", rt.Domain()}
	if metricsListen != "" {
		mln, err := net.Listen("tcp", metricsListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("listen on %s: %w", metricsListen, err)
		}
		parts["metrics"] = func(ctx context.Context) error { return server.Serve(ctx, mln, rt.Admin(), nil) }
		logAttrs = append(logAttrs, "metrics", mln.Addr().String())
	}
	cfg.Logger.Info("serving actors", logAttrs...)

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, len(parts))
	for name, run := range parts {
		go func() {
			err := run(ctx)
			stop()
			if err != nil {
				err = fmt.Errorf("%s: %w", name, err)
			}
			errc <- err
		}()
	}
	errs := make([]error, 0, len(parts))
	for range parts {
		errs = append(errs, <-errc)
	}
	return errors.Join(errs...)
}
