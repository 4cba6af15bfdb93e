package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"time"

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
		tlsListen     string
		metricsListen string
		logs          logFlags
		traces        traceFlags
		drain         drainFlags
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

An E2B sandbox's port P is reached at P-<sandbox id>.<domain>, or at any
host with the headers E2b-Sandbox-Id and E2b-Sandbox-Port (which the E2B SDK
sends to E2B_SANDBOX_URL); the control plane says which actor the ID is. A
sandbox that is not running answers 502 and is resumed only if it was
created with autoResume. With --tls-listen the router also serves HTTPS with
a certificate from the installation's CA for *.<domain>, <domain> and the
loopback names, issued at start (the control plane must serve the domain:
torpor server --ingress-domain) and renewed before it expires.

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
revokes it.

On SIGTERM the router drains: /healthz answers 503 "draining" at once; after
--drain-delay it stops accepting connections (idle keep-alive connections
close), waits up to --drain-timeout for the requests in flight, WebSockets
and tunnels included, closes what remains and exits 0. Several routers
behind a load balancer ride out each other's restarts (docs/operations.md).`,
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
			return runRouter(cmd.Context(), cfg, &member, listeners{listen: listen, tls: tlsListen, metrics: metricsListen}, drain)
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&member.ServerURL, "server", "https://127.0.0.1:7070", "control plane URL")
	flags.StringVar(&member.Name, "name", defaultNodeName(), "the router's client name (a DNS-1123 label), as its join token names it")
	join.register(flags, "torpor token create --client NAME --role router")
	flags.StringVar(&stateDir, "state-dir", "", "where the router keeps its certificate (default <data dir>/router/<name>)")
	flags.StringVar(&listen, "listen", "127.0.0.1:7080", "address to serve actors' traffic on")
	flags.StringVar(&tlsListen, "tls-listen", "", "address to serve HTTPS on, with a certificate for *.<domain> from the installation's CA (E2B sandboxes: https://<port>-<id>.<domain>); empty: none")
	flags.StringVar(&cfg.Domain, "domain", router.DefaultDomain, "parent domain of actor host names: <actor>.<space>.<domain>")
	flags.DurationVar(&cfg.ParkTimeout, "park-timeout", router.DefaultParkTimeout, "how long requests wait for a free worker or an unavailable control plane before 503")
	flags.DurationVar(&cfg.ResumeTimeout, "resume-timeout", router.DefaultResumeTimeout, "how long requests wait for a resume before 504")
	flags.DurationVar(&drain.delay, "drain-delay", 0, "on SIGTERM, how long the router keeps accepting connections while /healthz answers 503 draining, for a load balancer to take it out of rotation")
	flags.DurationVar(&drain.timeout, "drain-timeout", defaultDrainTimeout, "on SIGTERM, once it stops accepting, how long the router waits for requests, upgraded connections and tunnels in flight before it closes them")
	flags.StringVar(&metricsListen, "metrics-listen", "", "separate address for /metrics and /healthz (default: on --listen, for requests naming no actor)")
	logs.register(cmd.PersistentFlags(), "info")
	traces.register(cmd.PersistentFlags())
	return cmd
}

// routerCredentialsFile, in the router's state directory, keeps its key,
// certificate and CA.
const routerCredentialsFile = "router-credentials.json"

// routerListeners are where the router serves: actors' traffic on ln, and
// on tls over HTTPS when set, /metrics on metrics when set.
type routerListeners struct {
	ln, tls, metrics net.Listener
}

// defaultDrainTimeout is --drain-timeout's default: long enough for
// ordinary requests and resumes, short enough for a rolling restart.
const defaultDrainTimeout = 30 * time.Second

// drainFlags say how torpor router drains on SIGTERM.
type drainFlags struct {
	delay, timeout time.Duration
}

// startRouter gets the router's certificate (joining if it has none) and
// its HTTPS certificate when it serves HTTPS, then runs in g, in this
// order, the certificates' renewals, the activity reports, the metrics
// listener and the router serving its listeners: stopped in the reverse
// order, the router drains while the activity reports and /healthz go on.
func startRouter(ctx context.Context, g *rungroup.Group, cfg router.Config, member *identity.Member, lns routerListeners, drain drainFlags) (*router.Router, error) {
	creds, err := member.Credentials(ctx)
	if err != nil {
		return nil, err
	}
	cfg.HTTPClient = creds.ControlPlaneClient()
	rt, err := router.New(cfg)
	if err != nil {
		return nil, err
	}
	var ingress *router.IngressTLS
	if lns.tls != nil {
		if ingress, err = rt.IngressTLS(ctx); err != nil {
			return nil, err
		}
	}
	g.Go("router certificate", func(ctx context.Context) error {
		member.KeepRenewed(ctx, creds)
		return nil
	})
	if ingress != nil {
		g.Go("router HTTPS certificate", ingress.Run)
	}
	g.Go("router activity reports", rt.Run)
	if lns.metrics != nil {
		g.Go("router metrics", func(ctx context.Context) error { return httpserve.Serve(ctx, lns.metrics, rt.Admin(), nil) })
	}
	var servers []ingressServer
	if lns.ln != nil {
		servers = append(servers, ingressServer{ln: lns.ln})
	}
	if ingress != nil {
		servers = append(servers, ingressServer{ln: lns.tls, tls: ingress.Config()})
	}
	g.Go("router", func(ctx context.Context) error { return serveIngress(ctx, rt, servers, drain, cfg.Logger) })
	return rt, nil
}

// ingressServer is one listener of the router's ingress.
type ingressServer struct {
	ln  net.Listener
	tls *tls.Config
}

// serveIngress serves the router on its listeners until ctx ends, then
// drains them together (see the command's help); the first listener to
// fail stops the others.
func serveIngress(ctx context.Context, rt *router.Router, servers []ingressServer, drain drainFlags, log *slog.Logger) error {
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	errc := make(chan error, len(servers))
	for _, s := range servers {
		go func() { errc <- httpserve.ServeGrace(serveCtx, s.ln, rt, s.tls, drain.timeout) }()
	}
	var errs []error
	select {
	case err := <-errc:
		errs = append(errs, err)
	case <-ctx.Done():
		rt.Drain()
		log.Info("draining: /healthz answers 503", "delay", drain.delay, "timeout", drain.timeout)
		t := time.NewTimer(drain.delay)
		select {
		case <-t.C:
		case err := <-errc:
			errs = append(errs, err)
		}
		t.Stop()
	}
	stopServing()
	graceCtx, cancel := context.WithTimeout(context.Background(), drain.timeout)
	defer cancel()
	if n := rt.CloseHijacked(graceCtx); n > 0 {
		log.Info("drained: closed the upgraded connections and tunnels still open", "connections", n)
	}
	for range len(servers) - len(errs) {
		errs = append(errs, <-errc)
	}
	return errors.Join(errs...)
}

// listeners are the addresses torpor router serves on; tls and metrics
// may be empty (none).
type listeners struct {
	listen, tls, metrics string
}

// runRouter serves the router (and its metrics listener, if any) and
// reports activity until ctx is done; the first part to fail stops the
// rest.
func runRouter(ctx context.Context, cfg router.Config, member *identity.Member, addrs listeners, drain drainFlags) error {
	if addrs.listen == "" && addrs.tls == "" {
		return errors.New("--listen and --tls-listen are both empty: the router would serve nothing")
	}
	var lns routerListeners
	closeAll := func() {
		for _, l := range []net.Listener{lns.ln, lns.tls, lns.metrics} {
			if l != nil {
				l.Close()
			}
		}
	}
	logAttrs := []any{"server", cfg.Server}
	for _, l := range []struct {
		name, addr string
		ln         *net.Listener
	}{
		{"listen", addrs.listen, &lns.ln},
		{"tls", addrs.tls, &lns.tls},
		{"metrics", addrs.metrics, &lns.metrics},
	} {
		if l.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			closeAll()
			return fmt.Errorf("listen on %s: %w", l.addr, err)
		}
		*l.ln = ln
		logAttrs = append(logAttrs, l.name, ln.Addr().String())
	}
	g := rungroup.New(ctx)
	rt, err := startRouter(ctx, g, cfg, member, lns, drain)
	if err != nil {
		closeAll()
		return err
	}
	cfg.Logger.Info("serving actors", append(logAttrs, "domain", rt.Domain())...)
	return g.Run(ctx)
}
