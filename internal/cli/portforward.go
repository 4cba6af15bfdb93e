package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/client"
)

func newActorPortForwardCommand(a *app) *cobra.Command {
	var address, routerURL string
	cmd := &cobra.Command{
		Use:   "port-forward NAME [LOCAL:]PORT",
		Short: "Forward a local TCP port to a port of an actor, through the router",
		Long: "Listen on LOCAL (default: PORT) at --address and forward every connection to PORT\n" +
			"of the actor through the router (an HTTP CONNECT tunnel authorized by the API\n" +
			"token for the actor's space). Each connection resumes the actor if it is\n" +
			"suspended and keeps it running while open. Runs until interrupted.\n\n" +
			"The router is --router, else $" + client.EnvRouter + ", else router: in the client config file\n" +
			"(torpor up writes it), else " + client.DefaultRouter + ".\n" +
			"Other clients open the same tunnel without this command: see docs/operations.md,\n" +
			"\"TCP ports\".",
		Example: "  torpor actor port-forward redis 6379\n  torpor actor port-forward redis 16379:6379 --router https://router.example.com",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			local, remote, err := parsePortPair(args[1])
			if err != nil {
				return err
			}
			conn, err := client.Discover(client.Options{Server: a.serverFlag, CAFile: a.caFlag, Token: a.tokenFlag, Router: routerURL})
			if err != nil {
				return err
			}
			t := client.Tunnel{Router: conn.Router, Token: conn.Token}
			ctx := cmd.Context()
			// The first tunnel is opened before listening, so a refusal
			// (token, actor, port) is the command's error at once.
			first, err := t.Dial(ctx, a.space, args[0], remote)
			if err != nil {
				return err
			}
			first.Close()
			var lc net.ListenConfig
			ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(address, strconv.Itoa(local)))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Forwarding from %s to port %d of actor %s/%s\n", ln.Addr(), remote, a.space, args[0])
			return forward(ctx, ln, func(ctx context.Context) (net.Conn, error) { return t.Dial(ctx, a.space, args[0], remote) }, cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "local address to listen on")
	cmd.Flags().StringVar(&routerURL, "router", "", "router base URL (default: $"+client.EnvRouter+", else router: in the client config file, else "+client.DefaultRouter+")")
	return cmd
}

// parsePortPair reads [LOCAL:]PORT.
func parsePortPair(s string) (local, remote int, err error) {
	l, r, pair := strings.Cut(s, ":")
	if !pair {
		r = l
	}
	port := func(what, v string) (int, error) {
		p, err := strconv.Atoi(v)
		if err != nil || p < 0 || p > 65535 || (p == 0 && what == "port") {
			return 0, fmt.Errorf("%s %q in %q: want a port number ([LOCAL:]PORT)", what, v, s)
		}
		return p, nil
	}
	if remote, err = port("port", r); err != nil {
		return 0, 0, err
	}
	if local, err = port("local port", l); err != nil {
		return 0, 0, err
	}
	return local, remote, nil
}

// forward relays every connection ln accepts to a tunnel from dial, until
// ctx ends. A tunnel that cannot be opened closes its connection and is
// reported; the next connection tries again.
func forward(ctx context.Context, ln net.Listener, dial func(context.Context) (net.Conn, error), errs io.Writer) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			t, err := dial(ctx)
			if err != nil {
				fmt.Fprintf(errs, "connection from %s: %v\n", c.RemoteAddr(), err)
				return
			}
			defer t.Close()
			if err := splice(c, t); err != nil {
				slog.Debug("forwarded connection ended", "from", c.RemoteAddr(), "err", err)
			}
		}()
	}
}

// splice copies both ways; each side's end of input is passed on as a
// half close, and it returns once both directions ended.
func splice(a, b net.Conn) error {
	done := make(chan error, 1)
	go func() { done <- copyHalf(b, a) }()
	err := copyHalf(a, b)
	return errors.Join(err, <-done)
}

func copyHalf(dst, src net.Conn) error {
	_, err := io.Copy(dst, src)
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite() //nolint:errcheck // the peer may be gone
	} else {
		dst.Close()
	}
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
