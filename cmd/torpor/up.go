package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/cli"
	"github.com/torpor-dev/torpor/internal/httpserve"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/node"
	"github.com/torpor-dev/torpor/internal/router"
	"github.com/torpor-dev/torpor/internal/rungroup"
	"github.com/torpor-dev/torpor/internal/runtime/gvisor"
	"github.com/torpor-dev/torpor/internal/server"
	"github.com/torpor-dev/torpor/internal/version"
	"github.com/torpor-dev/torpor/internal/workflow"
)

func init() { register(newUpCommand) }

type upFlags struct {
	dataDir      string
	listen       string
	routerListen string
	nodeListen   string
	nodeName     string
	domain       string
	e2bListen    string
	e2bDomain    string
	workers      int
	headroom     int
	memoryFloor  int
	node         nodeFlags
	images       imageFlags
	logs         logFlags
	traces       traceFlags
	// metricsListen serves every part's metrics on one plain HTTP
	// endpoint.
	metricsListen string
	// routerTLSListen serves the router over HTTPS too ("": not).
	routerTLSListen string
}

func newUpCommand() *cobra.Command {
	var f upFlags
	cmd := &cobra.Command{
		Use:     "up",
		Example: "  torpor up\n  torpor up --workers 8 --router-listen 127.0.0.1:8080 --allow-image-dir ./examples",
		Short:   "Run Torpor on this machine: server, one node agent and the router in one process",
		Long: `Run Torpor on this machine: the control plane on SQLite, one node agent with
--workers worker slots and the router, in one process, all state under
--data-dir. The client settings (API URL, CA certificate and admin token) are
written where the CLI finds them, so plain 'torpor actor list' works
afterwards. Ctrl-C suspends every running
actor, then stops. Needs root (sandboxes and network namespaces).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return up(cmd.Context(), cmd.ErrOrStderr(), f) },
	}
	flags := cmd.Flags()
	flags.StringVar(&f.dataDir, "data-dir", "", "where the database, snapshots and node state live (default $XDG_DATA_HOME/torpor or ~/.local/share/torpor)")
	flags.StringVar(&f.listen, "listen", "127.0.0.1:7070", "API address")
	flags.StringVar(&f.routerListen, "router-listen", "127.0.0.1:7080", "router address (actors' HTTP traffic)")
	flags.StringVar(&f.routerTLSListen, "router-tls-listen", "127.0.0.1:7443", "router HTTPS address, with a certificate for *.<domain> from the installation's CA (ca.pem): E2B sandboxes at https://<port>-<id>.<domain>:<its port>; empty: none")
	flags.StringVar(&f.nodeListen, "node-listen", "127.0.0.1:7071", "node agent address")
	flags.StringVar(&f.metricsListen, "metrics-listen", "127.0.0.1:7090", "address of /metrics (plain HTTP): the server's, the node agent's and the router's metrics in one place; empty: none")
	flags.StringVar(&f.domain, "domain", router.DefaultDomain, "actors are reached at <actor>.<space>.<domain>")
	flags.StringVar(&f.e2bListen, "e2b-listen", "127.0.0.1:7030", "address of the E2B-compatible API in plain HTTP (E2B_API_URL=http://ADDR; docs/e2b.md); empty: none (the API port serves it too, over HTTPS)")
	flags.StringVar(&f.e2bDomain, "e2b-domain", "", "domain the E2B API answers the SDK with, sandbox ports being <port>-<id>.<domain> (default <--domain>:<router port>)")
	flags.IntVar(&f.workers, "workers", 4, "worker slots")
	flags.IntVar(&f.headroom, "headroom", 0, "workers to keep free by evicting idle actors early, so a resume rarely waits for an eviction")
	flags.IntVar(&f.memoryFloor, "node-memory-floor", workflow.DefaultNodeMemoryFloor, "percent of the machine's memory below which frozen actors (idlePolicy.freezeSeconds) are paused or suspended, least recently active first; 0: never")
	flags.StringVar(&f.nodeName, "node-name", defaultNodeName(), "name of the node agent (a DNS-1123 label); workers are <name>-w<i>")
	flags.StringVar(&f.node.runsc, "runsc", "", "runsc binary (default: runsc next to this binary, else in PATH)")
	flags.StringVar(&f.node.bridge, "bridge", netns.DefaultBridge, "bridge of the workers' network namespaces")
	flags.StringVar(&f.node.cidr, "cidr", netns.DefaultCIDR, "workers' subnet")
	flags.StringVar(&f.node.dns, "dns", "", dnsFlagHelp)
	flags.BoolVar(&f.node.egress, "egress", true, "let workloads reach networks beyond this host as their egress policies allow, masqueraded as it (turns on IPv4 forwarding); --egress=false: every workload's policy is deny (nothing beyond the node), and its start says so")
	f.images.register(flags)
	f.logs.register(cmd.PersistentFlags(), "warn")
	f.traces.register(cmd.PersistentFlags())
	return cmd
}

func up(ctx context.Context, stderr io.Writer, f upFlags) error {
	logger, err := f.logs.logger(stderr)
	if err != nil {
		return err
	}
	stopTraces, err := f.traces.start("torpor-up", logger)
	if err != nil {
		return err
	}
	defer stopTraces()
	if f.dataDir == "" {
		dir, err := cli.DataDir()
		if err != nil {
			return err
		}
		f.dataDir = dir
	}
	if err := os.MkdirAll(f.dataDir, 0o755); err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	// The server checks templates against it and the node again.
	images, err := f.images.policy(f.dataDir)
	if err != nil {
		return err
	}
	apiLn, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	routerLn, err := net.Listen("tcp", f.routerListen)
	if err != nil {
		apiLn.Close()
		return fmt.Errorf("--router-listen: %w", err)
	}
	var routerTLSLn net.Listener
	if f.routerTLSListen != "" {
		if routerTLSLn, err = net.Listen("tcp", f.routerTLSListen); err != nil {
			apiLn.Close()
			routerLn.Close()
			return fmt.Errorf("--router-tls-listen: %w", err)
		}
		// Closed by the router's server once it serves; closing it again
		// then is harmless.
		defer routerTLSLn.Close()
	}
	var metricsLn net.Listener
	if f.metricsListen != "" {
		if metricsLn, err = net.Listen("tcp", f.metricsListen); err != nil {
			apiLn.Close()
			routerLn.Close()
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		defer metricsLn.Close()
	}
	var e2bLn net.Listener
	if f.e2bListen != "" {
		if e2bLn, err = net.Listen("tcp", f.e2bListen); err != nil {
			apiLn.Close()
			routerLn.Close()
			return fmt.Errorf("--e2b-listen: %w", err)
		}
	}
	if f.e2bDomain == "" {
		// What the router answers: the SDK reaches a sandbox's port at
		// <port>-<id>.<domain>, the router's port included.
		f.e2bDomain = net.JoinHostPort(f.domain, strconv.Itoa(routerLn.Addr().(*net.TCPAddr).Port))
	}
	// One registry for the three parts: each metric once, build and
	// process metrics included.
	metrics := version.NewRegistry()
	f.node.snapshots = filepath.Join(f.dataDir, "snapshots")
	cp, err := server.Start(ctx, server.Options{
		Logger: logger, Listen: apiLn.Addr().String(), Listener: apiLn,
		Store: "sqlite:" + filepath.Join(f.dataDir, "torpor.db"), Snapshots: f.node.snapshots,
		AdminTokenFile: filepath.Join(f.dataDir, "admin-token"), CAFile: filepath.Join(f.dataDir, "ca.pem"),
		Images: images, Headroom: map[string]int{"default": f.headroom}, NodeMemoryFloor: f.memoryFloor, Registry: metrics,
		E2BListener: e2bLn, E2BDomain: f.e2bDomain,
		// The router's HTTPS certificate is for its domain.
		IngressDomains: []string{f.domain},
	})
	if err != nil {
		routerLn.Close()
		return err
	}
	// The parts stop in the reverse order of their start: the router,
	// then the running actors are suspended while the node agent and the
	// API still run, then the node agent, then the API.
	g := rungroup.New(ctx)
	g.Go("control plane", cp.Run)
	if metricsLn != nil {
		handler := http.NewServeMux()
		handler.Handle("GET /metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
		g.Go("metrics", func(ctx context.Context) error { return httpserve.Serve(ctx, metricsLn, handler, nil) })
	}
	nodeCfg, agent, err := upNode(f, cp, images, metrics, logger)
	if err != nil {
		routerLn.Close()
		return errors.Join(err, g.Stop())
	}
	g.Go("node agent", agent.Run)
	g.Go("suspend on shutdown", func(ctx context.Context) error {
		<-ctx.Done()
		suspendAll(stderr, cp.Server, nodeCfg, f)
		return nil
	})
	// The router joins over the API, so it starts once the API serves. A
	// router that cannot start stops the rest, as a failing part does.
	if _, err := startRouter(ctx, g, router.Config{Server: cp.URL, Domain: f.domain, Logger: logger, AdminOnIngress: true, Registerer: metrics}, upRouterMember(f, cp, logger), routerListeners{ln: routerLn, tls: routerTLSLn}, drainFlags{timeout: httpserve.DefaultGrace}); err != nil {
		routerLn.Close()
		g.Go("router", func(context.Context) error { return err })
	}

	// Every endpoint the CLI uses goes into its config, the router's too
	// (port-forward tunnels through it).
	routerURL := "http://" + dialable(routerLn.Addr())
	routerTLSURL := ""
	if routerTLSLn != nil {
		routerTLSURL = "https://" + dialable(routerTLSLn.Addr())
	}
	// "up" means a request can be served: wait for the node's workers.
	select {
	case <-agent.Registered():
	case <-g.Failed():
	case <-ctx.Done():
	}
	configPath, err := client.ConfigPath()
	if err == nil {
		err = client.WriteConfig(configPath, client.Config{Server: cp.URL, CA: string(cp.CAPEM), Token: cp.AdminToken, Router: routerURL, Domain: f.domain})
	}
	if err != nil {
		logger.Warn("write client config", "err", err)
	}
	printWelcome(stderr, cp, configPath, routerURL, routerTLSURL, f)

	select {
	case <-ctx.Done():
	case <-g.Failed():
		logger.Error("stopping", "err", g.Err())
	}
	fmt.Fprintln(stderr, "\nShutting down: suspending running actors...")
	g.Stop()
	return nil
}

// upNode is the node agent of `torpor up`: it joins with a token made
// here (only while it has no certificate yet), as a separate process
// would.
func upNode(f upFlags, cp *server.Running, images *image.Policy, metrics *prometheus.Registry, logger *slog.Logger) (node.Config, *node.Agent, error) {
	cfg := node.Config{
		Name:      f.nodeName,
		ServerURL: cp.URL,
		Listen:    f.nodeListen,
		Workers:   f.workers,
		Pool:      "default",
		StateDir:  filepath.Join(f.dataDir, "node"),
		Images:    images,
		Registry:  metrics,
	}
	f.node.runtime = gvisor.Class
	if err := completeNodeConfig(&cfg, &f.node, logger); err != nil {
		return cfg, nil, err
	}
	cfg.CAFingerprint = cp.Authority.CAFingerprint()
	cfg.JoinToken = func(ctx context.Context) (string, error) {
		tok, err := cp.Authority.CreateToken(ctx, identity.TokenRequest{Purpose: identity.PurposeNodeJoin, Name: cfg.Name, TTL: 10 * time.Minute})
		return tok.Secret, err
	}
	agent, err := node.New(cfg)
	return cfg, agent, err
}

// upRouterMember is the router of `torpor up` as an API client: it joins
// with a token made here (only while it has no certificate yet) and then
// talks mutual TLS, as a separate process would.
func upRouterMember(f upFlags, cp *server.Running, logger *slog.Logger) *identity.Member {
	m := &identity.Member{
		Kind: identity.MemberClient, Name: "router", ServerURL: cp.URL,
		File:          filepath.Join(f.dataDir, "router", routerCredentialsFile),
		CAFingerprint: cp.Authority.CAFingerprint(),
		Logger:        logger,
	}
	m.JoinToken = func(ctx context.Context) (string, error) {
		tok, err := cp.Authority.CreateToken(ctx, identity.TokenRequest{Purpose: identity.PurposeClientJoin, Name: m.Name, Role: identity.RoleRouter, TTL: 10 * time.Minute})
		return tok.Secret, err
	}
	return m
}

// suspendAll suspends every running actor, so a single-machine shutdown
// leaves nothing that needs the node to come back, and says how it went.
func suspendAll(stderr io.Writer, srv *server.Server, nodeCfg node.Config, f upFlags) {
	shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := srv.SuspendAll(shutdown)
	fmt.Fprintf(stderr, "Suspended %d actor(s).\n", n)
	if err != nil {
		fmt.Fprintf(stderr, "Some actors could not be suspended (they resume from their last snapshot): %v\n", err)
		fmt.Fprintf(stderr, "Their sandboxes stay for the next start; to remove them and the workers' network instead:\n  %s node --cleanup --name %s --state-dir %s --bridge %s --cidr %s\n",
			os.Args[0], nodeCfg.Name, nodeCfg.StateDir, f.node.bridge, f.node.cidr)
	}
}

func printWelcome(w io.Writer, cp *server.Running, configPath, routerURL, routerTLSURL string, f upFlags) {
	self := os.Args[0]
	apiURL := cp.URL
	fmt.Fprintf(w, `
Torpor is up.
  API      %s   (the CLI finds it, its CA and the admin token: %s)
  web      %s/dashboard/   (the dashboard: log in with the admin token)
  router   %s   (actors answer at <actor>.<space>.%s)
  workers  %d gVisor slots
  data     %s   (admin-token and ca.pem for other clients)
`, apiURL, configPath, apiURL, routerURL, f.domain, f.workers, f.dataDir)
	if routerTLSURL != "" {
		fmt.Fprintf(w, "  https    %s   (the router over HTTPS, certificate for *.%s from ca.pem)\n", routerTLSURL, f.domain)
	}
	if cp.E2BURL != "" {
		fmt.Fprintf(w, "  E2B      %s   (for the E2B SDK: E2B_API_URL=%s E2B_DOMAIN=%s E2B_SANDBOX_URL=%s; docs/e2b.md)\n",
			cp.E2BURL, cp.E2BURL, f.e2bDomain, routerURL)
	}
	fmt.Fprintf(w, `
Next, in another terminal:
  %s template apply -f examples/counter/template.yaml --wait
  %s actor create c1 --template counter
  curl -H 'Host: c1.default.%s' %s/
  %s actor suspend c1
  curl -H 'Host: c1.default.%s' %s/

Ctrl-C suspends running actors and stops.
`, self, self, f.domain, routerURL, self, f.domain, routerURL)
}

// dialable is addr as a client on this machine dials it: an unspecified
// host (0.0.0.0, ::) is the loopback one.
func dialable(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return addr.String()
	}
	loopback := net.IPv4(127, 0, 0, 1)
	if tcp.IP.To4() == nil {
		loopback = net.IPv6loopback
	}
	return net.JoinHostPort(loopback.String(), strconv.Itoa(tcp.Port))
}
