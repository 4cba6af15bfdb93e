package gateproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/slotgate"
)

// Options configure the gate process (`torpor node gate`).
type Options struct {
	// StateDir is the node's state directory: the control socket, pid
	// file and lock live there.
	StateDir string
	// Listen is the gate's TCP address (routers dial it).
	Listen string
	Logger *slog.Logger
	// Pausers freezes idle slots (slotgate.Options.Pausers); nil: none.
	Pausers func(control string) slotgate.Pauser
}

// freezeDir is where the gate keeps its freeze markers.
const freezeDir = "frozen"

// FreezeMarks is the directory of the freeze markers of stateDir's slot
// gate, in the process or in the agent.
func FreezeMarks(stateDir string) string { return filepath.Join(stateDir, freezeDir) }

// Run is the gate process: it listens on opts.Listen, answers the agent
// on the control socket, and serves the gate once the agent said so,
// until ctx ends or the agent asks it to exit. Either way it closes every
// connection it spliced. One gate runs per state directory.
func Run(ctx context.Context, opts Options) error {
	log := opts.Logger
	unlock, err := lock(filepath.Join(opts.StateDir, lockFile))
	if err != nil {
		return err
	}
	defer unlock()
	tcp, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return fmt.Errorf("slot gate: listen on %s: %w", opts.Listen, err)
	}
	defer tcp.Close()
	sock := SocketPath(opts.StateDir)
	// The lock is held: a socket left there is a dead gate's.
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("slot gate: control socket: %w", err)
	}
	// Closed by the control server, which removes the file then.
	ctl, err := listenUnix(sock)
	if err != nil {
		return err
	}
	pid := filepath.Join(opts.StateDir, pidFile)
	if err := os.WriteFile(pid, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		ctl.Close()
		return fmt.Errorf("slot gate: pid file: %w", err)
	}
	defer os.Remove(pid)

	ctx, exit := context.WithCancel(ctx)
	defer exit()
	c := &control{log: log, addr: tcp.Addr().String(), exit: exit}
	gate := slotgate.New(log, slotgate.Options{Pausers: opts.Pausers, MarkDir: FreezeMarks(opts.StateDir), Notify: c.notify})
	c.gate = gate
	var serving sync.WaitGroup
	var serveErr error
	c.serve = func() {
		serving.Go(func() { serveErr = gate.Serve(ctx, tcp) })
	}
	log.Info("slot gate started; it serves once the node agent told it the slots' occupants", "addr", c.addr, "pid", os.Getpid())
	err = c.Serve(ctx, ctl)
	exit()
	serving.Wait()
	log.Info("slot gate stopped")
	return errors.Join(err, serveErr)
}

// listenUnix listens on the control socket, for root only.
func listenUnix(path string) (net.Listener, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("slot gate: control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("slot gate: control socket: %w", err)
	}
	return ln, nil
}

// lock takes the state directory's gate lock: a second gate would take
// the first one's socket.
func lock(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("slot gate: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("slot gate: another gate runs for %s", filepath.Dir(path))
		}
		return nil, fmt.Errorf("slot gate: lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
