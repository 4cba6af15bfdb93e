package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/cli"
	"github.com/torpor-dev/torpor/internal/httpserve"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/router"
	"github.com/torpor-dev/torpor/internal/rungroup"
)

func init() { register(newRouterCommand) }

func newRouterCommand() *cobra.Command {
	var (
		cfg           router.Config
		member        = identity.Member{Kind: identity.MemberClient}
		join          joinFlags
		stateDir      string
		listen        string
		metricsListen string
		logs          logFlags
		traces        traceFlags
	)
	cmd := &cobra.Command{
		Use:     "router",
		Example: "  torpor router --name edge --server https://api.example.com:7070 --join-token T --ca-fingerprint sha256:... --listen 0.0.0.0:80",
		Short:   "Run the HTTP ingress: route requests to actors, resuming them on demand",
		Long: `Run the HTTP ingress. A request reaches actor <space>/<actor> by its host
name, <actor>.<space>.<domain> (any port), or by the header
Torpor-Actor: <space>/<actor>, which wins. An actor that is not running is
resumed first (one resume however many requests wait); while no worker is
free, or the control plane cannot answer (restarting), requests wait up to
--park-timeout, then get 503 with Retry-After.
The router reports the traffic it serves to the control plane four times a
second, and a request for an actor it has not reported active for half a
second before it looks the actor up; the control plane applies the templates' idle policies and
evicts idle actors when a resume finds no free worker.

Prometheus metrics are served at /metrics (with /healthz) on
--metrics-listen when it is set; otherwise on --listen, to requests that name
no actor (any other Host, no Torpor-Actor header), so they never shadow an
actor's own paths.

The router talks to the control plane over mutual TLS, as API client --name
with the router role. The first start joins with a token an admin made for
it, trusting only a server of the CA that --ca-fingerprint (or the
certificate in --ca) pins:

  torpor token create --client NAME --role router [--spaces A,B]
  torpor router --name NAME --server https://HOST:7070 --join-token T --ca-fingerprint sha256:...

The router then reaches the actors of those spaces (of every space without
--spaces); others answer 403. The certificate is kept (and renewed) in
--state-dir, so later starts need no token; torpor client delete NAME
revokes it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := logs.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			stop, err := traces.start("torpor-router", logger)
			if err != nil {
				return err
			}
			defer stop()
			if member.CAFingerprint, member.JoinToken, err = join.resolve(); err != nil {
				return err
			}
			member.KubernetesToken = join.kubernetesToken()
			if stateDir == "" {
				dir, err := cli.DataDir()
				if err != nil {
					return err
				}
				stateDir = filepath.Join(dir, "router", member.Name)
			}
			member.File = filepath.Join(stateDir, routerCredentialsFile)
			member.Logger = logger.With("router", member.Name)
			cfg.Server = member.ServerURL
			cfg.Name = member.Name
			cfg.Logger = logger
			cfg.AdminOnIngress = metricsListen == ""
			return runRouter(cmd.Context(), cfg, &member, listen, metricsListen)
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&member.ServerURL, "server", "https://127.0.0.1:7070", "control plane URL")
	flags.StringVar(&member.Name, "name", defaultNodeName(), "the router's client name (a DNS-1123 label), as its join token names it")
	join.register(flags, "torpor token create --client NAME --role router")
	flags.StringVar(&stateDir, "state-dir", "", "where the router keeps its certificate (default <data dir>/router/<name>)")
	flags.StringVar(&listen, "listen", "127.0.0.1:7080", "address to serve actors' traffic on")
	flags.StringVar(&cfg.Domain, "domain", router.DefaultDomain, "parent domain of actor host names: <actor>.<space>.<domain>")
	flags.DurationVar(&cfg.ParkTimeout, "park-timeout", router.DefaultParkTimeout, "how long requests wait for a free worker or an unavailable control plane before 503")
	flags.DurationVar(&cfg.ResumeTimeout, "resume-timeout", router.DefaultResumeTimeout, "how long requests wait for a resume before 504")
	flags.StringVar(&metricsListen, "metrics-listen", "", "separate address for /metrics and /healthz (default: on --listen, for requests naming no actor)")
	logs.register(cmd.PersistentFlags(), "info")
	traces.register(cmd.PersistentFlags())
	return cmd
}

// routerCredentialsFile, in the router's state directory, keeps its key,
// certificate and CA.
const routerCredentialsFile = "router-credentials.json"

// startRouter gets the router's certificate (joining if it has none), then
// runs in g, in this order, the certificate's renewal, the activity
// reports and the router serving actors' traffic on ln (and /metrics on
// metricsLn, when set).
func startRouter(ctx context.Context, g *rungroup.Group, cfg router.Config, member *identity.Member, ln, metricsLn net.Listener) (*router.Router, error) {
	creds, err := member.Credentials(ctx)
	if err != nil {
		return nil, err
	}
	cfg.HTTPClient = creds.ControlPlaneClient()
	rt, err := router.New(cfg)
	if err != nil {
		return nil, err
	}
	g.Go("router certificate", func(ctx context.Context) error {
		member.KeepRenewed(ctx, creds)
		return nil
	})
	g.Go("router activity reports", rt.Run)
	g.Go("router", func(ctx context.Context) error { return httpserve.Serve(ctx, ln, rt, nil) })
	if metricsLn != nil {
		g.Go("router metrics", func(ctx context.Context) error { return httpserve.Serve(ctx, metricsLn, rt.Admin(), nil) })
	}
	return rt, nil
}

// runRouter serves the router (and its metrics listener, if any) and
// reports activity until ctx is done; the first part to fail stops the
// rest.
func runRouter(ctx context.Context, cfg router.Config, member *identity.Member, listen, metricsListen string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", listen, err)
	}
	var mln net.Listener
	logAttrs := []any{"listen", ln.Addr().String(), "server", cfg.Server}
	if metricsListen != "" {
		if mln, err = net.Listen("tcp", metricsListen); err != nil {
			ln.Close()
			return fmt.Errorf("listen on %s: %w", metricsListen, err)
		}
		logAttrs = append(logAttrs, "metrics", mln.Addr().String())
	}
	g := rungroup.New(ctx)
	rt, err := startRouter(ctx, g, cfg, member, ln, mln)
	if err != nil {
		ln.Close()
		if mln != nil {
			mln.Close()
		}
		return err
	}
	cfg.Logger.Info("serving actors", append(logAttrs, "domain", rt.Domain())...)
	return g.Run(ctx)
}
