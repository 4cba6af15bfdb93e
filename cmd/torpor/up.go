package main

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/cli"
	"github.com/torpor-dev/torpor/internal/httpserve"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/node"
	"github.com/torpor-dev/torpor/internal/router"
	"github.com/torpor-dev/torpor/internal/runtime/gvisor"
	"github.com/torpor-dev/torpor/internal/server"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
)

func init() { register(newUpCommand) }

type upFlags struct {
	dataDir      string
	listen       string
	routerListen string
	nodeListen   string
	nodeName     string
	domain       string
	workers      int
	headroom     int
	node         nodeFlags
	images       imageFlags
}

func newUpCommand() *cobra.Command {
	var f upFlags
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run Torpor on this machine: server, one node agent and the router in one process",
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
	flags.StringVar(&f.nodeListen, "node-listen", "127.0.0.1:7071", "node agent address")
	flags.StringVar(&f.domain, "domain", router.DefaultDomain, "actors are reached at <actor>.<space>.<domain>")
	flags.IntVar(&f.workers, "workers", 4, "worker slots")
	flags.IntVar(&f.headroom, "headroom", 0, "workers to keep free by evicting idle actors early, so a resume rarely waits for an eviction")
	flags.StringVar(&f.nodeName, "node-name", defaultNodeName(), "name of the node agent (a DNS-1123 label); workers are <name>-w<i>")
	flags.StringVar(&f.node.runsc, "runsc", "", "runsc binary (default: runsc next to this binary, else in PATH)")
	flags.StringVar(&f.node.bridge, "bridge", netns.DefaultBridge, "bridge of the workers' network namespaces")
	flags.StringVar(&f.node.cidr, "cidr", netns.DefaultCIDR, "workers' subnet")
	flags.BoolVar(&f.node.egress, "egress", true, "let workloads reach networks beyond this host, masqueraded as it (turns on IPv4 forwarding); --egress=false: the host only")
	f.images.register(flags)
	return cmd
}

func up(ctx context.Context, stderr io.Writer, f upFlags) error {
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
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
		return fmt.Errorf("--router-listen: %w", err)
	}
	apiURL := "https://" + apiLn.Addr().String()

	dbPath := filepath.Join(f.dataDir, "torpor.db")
	st, err := store.Open(ctx, "sqlite:"+dbPath)
	if err != nil {
		return err
	}
	defer st.Close()
	f.node.snapshots = filepath.Join(f.dataDir, "snapshots")
	objects, err := snapshot.NewDirStore(f.node.snapshots)
	if err != nil {
		return err
	}
	srv := server.New(st, objects, server.Options{
		Logger: logger, Listen: apiLn.Addr().String(),
		AdminTokenFile: filepath.Join(f.dataDir, "admin-token"), CAFile: filepath.Join(f.dataDir, "ca.pem"),
		Images: images, Headroom: map[string]int{"default": f.headroom},
	})
	if err := srv.WriteClientFiles(ctx); err != nil {
		return err
	}
	// The parts authenticate to each other as separate processes would:
	// the node and the router join with tokens (made here, only when they
	// have no certificate yet) and then talk mutual TLS; the CLI uses the
	// admin token.
	ca, err := srv.Authority(ctx)
	if err != nil {
		return err
	}
	adminToken, err := srv.AdminToken(ctx)
	if err != nil {
		return err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.CACertificate().Raw})

	nodeCfg := node.Config{
		Name:      f.nodeName,
		ServerURL: apiURL,
		Listen:    f.nodeListen,
		Workers:   f.workers,
		Pool:      "default",
		StateDir:  filepath.Join(f.dataDir, "node"),
		Images:    images,
	}
	routerMember := &identity.Member{
		Kind: identity.MemberClient, Name: "router", ServerURL: apiURL,
		File:          filepath.Join(f.dataDir, "router", routerCredentialsFile),
		CAFingerprint: ca.CAFingerprint(),
		Logger:        logger,
	}
	routerMember.JoinToken = func(ctx context.Context) (string, error) {
		tok, err := ca.CreateToken(ctx, identity.TokenRequest{Purpose: identity.PurposeClientJoin, Name: routerMember.Name, Role: identity.RoleRouter, TTL: 10 * time.Minute})
		return tok.Secret, err
	}
	f.node.runtime = gvisor.Class
	if err := completeNodeConfig(&nodeCfg, &f.node, logger); err != nil {
		return err
	}
	nodeCfg.CAFingerprint = ca.CAFingerprint()
	nodeCfg.JoinToken = func(ctx context.Context) (string, error) {
		tok, err := ca.CreateToken(ctx, identity.TokenRequest{Purpose: identity.PurposeNodeJoin, Name: nodeCfg.Name, TTL: 10 * time.Minute})
		return tok.Secret, err
	}
	agent, err := node.New(nodeCfg)
	if err != nil {
		return err
	}

	// Each part stops on its own context, so shutdown can suspend actors
	// while the API and the node agent still run.
	apiCtx, stopAPI := context.WithCancel(context.WithoutCancel(ctx))
	nodeCtx, stopNode := context.WithCancel(context.WithoutCancel(ctx))
	routerCtx, stopRouter := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	errc := make(chan error, 6)
	run := func(what string, fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(); err != nil && !errors.Is(err, context.Canceled) {
				errc <- fmt.Errorf("%s: %w", what, err)
			}
		}()
	}
	// The certificate comes first: the background work calls the node
	// agent with it.
	apiTLS, err := srv.TLSConfig(apiCtx, apiLn.Addr())
	if err != nil {
		stopAPI()
		stopNode()
		stopRouter()
		return err
	}
	run("API", func() error { return httpserve.Serve(apiCtx, apiLn, srv.Handler(), apiTLS) })
	go srv.RunBackground(apiCtx)
	run("node agent", func() error { return agent.Run(nodeCtx) })
	// The router joins over the API, so it starts once the API serves.
	api, keepRouterCertificate, err := routerAPI(ctx, routerMember)
	if err == nil {
		var rt *router.Router
		if rt, err = router.New(router.Config{Server: apiURL, HTTPClient: api, Domain: f.domain, Logger: logger, AdminOnIngress: true}); err == nil {
			run("router", func() error { return httpserve.Serve(routerCtx, routerLn, rt, nil) })
			run("router activity reports", func() error { return rt.Run(routerCtx) })
			run("router certificate", func() error { return keepRouterCertificate(routerCtx) })
		}
	}
	if err != nil {
		errc <- fmt.Errorf("router: %w", err)
	}

	// "up" means a request can be served: wait for the node's workers.
	select {
	case <-agent.Registered():
	case err := <-errc:
		errc <- err
	case <-ctx.Done():
	}

	configPath, err := cli.ConfigPath()
	if err == nil {
		err = cli.WriteClientConfig(configPath, cli.ClientConfig{Server: apiURL, CA: string(caPEM), Token: adminToken})
	}
	if err != nil {
		logger.Warn("write client config", "err", err)
	}
	printWelcome(stderr, apiURL, configPath, "http://"+routerLn.Addr().String(), f)

	select {
	case <-ctx.Done():
	case err := <-errc:
		logger.Error("stopping", "err", err)
	}
	fmt.Fprintln(stderr, "\nShutting down: suspending running actors...")
	stopRouter()
	shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := srv.SuspendAll(shutdown)
	fmt.Fprintf(stderr, "Suspended %d actor(s).\n", n)
	if err != nil {
		fmt.Fprintf(stderr, "Some actors could not be suspended (they resume from their last snapshot): %v\n", err)
		fmt.Fprintf(stderr, "Their sandboxes stay for the next start; to remove them and the workers' network instead:\n  %s node --cleanup --name %s --state-dir %s --bridge %s --cidr %s\n",
			os.Args[0], nodeCfg.Name, nodeCfg.StateDir, f.node.bridge, f.node.cidr)
	}
	stopNode()
	stopAPI()
	wg.Wait()
	return nil
}

func printWelcome(w io.Writer, apiURL, configPath, routerURL string, f upFlags) {
	self := os.Args[0]
	fmt.Fprintf(w, `
Torpor is up.
  API      %s   (the CLI finds it, its CA and the admin token: %s)
  router   %s   (actors answer at <actor>.<space>.%s)
  workers  %d gVisor slots
  data     %s   (admin-token and ca.pem for other clients)

Next, in another terminal:
  %s template apply -f examples/counter/template.yaml --wait
  %s actor create c1 --template counter
  curl -H 'Host: c1.default.%s' %s/
  %s actor suspend c1
  curl -H 'Host: c1.default.%s' %s/

Ctrl-C suspends running actors and stops.
`, apiURL, configPath, routerURL, f.domain, f.workers, f.dataDir,
		self, self, f.domain, routerURL, self, f.domain, routerURL)
}
