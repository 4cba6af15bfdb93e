package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/torpor-dev/torpor/internal/atomicfile"
	"github.com/torpor-dev/torpor/internal/gateproc"
	"github.com/torpor-dev/torpor/internal/slotgate"
)

// gateFile keeps the address the slot gate listened on, so a restarted
// agent (or gate) listens there again: running actors' placements name it
// (WorkerRef.gate), and routers keep dialling it until the actor moves.
const gateFile = "gate.addr"

// slotGate is the node's slot gate as the agent drives it: inside the
// agent (localGate: it dies with the agent, as in tests' agents) or as a
// process of its own (processGate: routed connections survive the agent's
// restart). The slots tell it their occupants from their load on; it
// serves from start, once the slots are adopted.
type slotGate interface {
	Occupy(worker, ip, actorUID string, f slotgate.Freeze)
	// Hold thaws a frozen slot and keeps it awake until release.
	Hold(worker string) (release func(), err error)
	// start listens on addr (fixed: as asked) and returns where it does.
	start(ctx context.Context, addr string, fixed bool) (string, error)
	// serve runs until ctx ends.
	serve(ctx context.Context) error
	// stop is the agent's stop, after serve's; idle says no workload is
	// left on the node.
	stop(idle bool) error
}

// newSlotGate returns the node's gate; notify hears of its freezes and
// thaws (freeze.go).
func newSlotGate(cfg Config, log *slog.Logger, notify func(slotgate.Change)) slotGate {
	if len(cfg.GateCommand) == 0 {
		opts := slotgate.Options{Pausers: pausers(cfg.Runtime), MarkDir: gateproc.FreezeMarks(cfg.StateDir), Notify: notify}
		return &localGate{Gate: slotgate.New(log, opts), log: log}
	}
	return processGate{gateproc.NewClient(gateproc.Config{StateDir: cfg.StateDir, Command: cfg.GateCommand, Logger: log, OnChange: notify})}
}

// openGate starts the slot gate: on cfg.GateListen when set, else where
// it last listened, else on the API's host with a port the system picks.
// It returns the address workers advertise (an unspecified host advertised
// as 127.0.0.1).
func openGate(ctx context.Context, cfg Config, g slotGate, apiAddr net.Addr) (string, error) {
	file := filepath.Join(cfg.StateDir, gateFile)
	addr, fixed := cfg.GateListen, cfg.GateListen != ""
	if !fixed {
		prev, err := os.ReadFile(file)
		switch {
		case err == nil:
			addr = strings.TrimSpace(string(prev))
		case !errors.Is(err, fs.ErrNotExist):
			return "", fmt.Errorf("slot gate: %w", err)
		default:
			host, _, err := net.SplitHostPort(apiAddr.String())
			if err != nil {
				return "", fmt.Errorf("slot gate: API address %s: %w", apiAddr, err)
			}
			addr = net.JoinHostPort(host, "0")
		}
	}
	addr, err := g.start(ctx, addr, fixed)
	if err != nil {
		return "", err
	}
	if err := atomicfile.Write(file, []byte(addr), 0o600); err != nil {
		return "", fmt.Errorf("slot gate: %w", err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("slot gate: address %s: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// localGate is the gate inside the agent.
type localGate struct {
	*slotgate.Gate
	log *slog.Logger
	ln  net.Listener
}

func (g *localGate) start(_ context.Context, addr string, _ bool) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("slot gate: listen on %s: %w", addr, err)
	}
	g.ln = ln
	return ln.Addr().String(), nil
}

func (g *localGate) serve(ctx context.Context) error {
	// A gate that fails leaves the API serving: logged, not fatal.
	if err := g.Serve(ctx, g.ln); err != nil {
		g.log.Error("slot gate", "err", err)
	}
	<-ctx.Done()
	return nil
}

// stop has nothing left to do: serve closed the listener and every
// connection.
func (g *localGate) stop(bool) error { return nil }

// processGate is the gate process (`torpor node gate`, internal/gateproc).
type processGate struct{ *gateproc.Client }

func (g processGate) start(ctx context.Context, addr string, fixed bool) (string, error) {
	return g.Start(ctx, addr, fixed)
}

func (g processGate) serve(ctx context.Context) error { return g.Supervise(ctx) }

// stop leaves the gate serving the workloads that stay, as their
// sandboxes do; with none left, nothing of the node stays: it exits.
func (g processGate) stop(idle bool) error {
	if !idle {
		g.Detach()
		return nil
	}
	if err := g.Exit(); err != nil {
		return fmt.Errorf("stop: slot gate: %w", err)
	}
	return nil
}
