package gateproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/internal/slotgate"
)

// Config configures the agent's side of the gate process.
type Config struct {
	// StateDir is the node's state directory (absolute).
	StateDir string
	// Command starts the gate process: the program and its arguments
	// (`torpor node gate`), to which --state-dir and --listen are added.
	Command []string
	Logger  *slog.Logger
	// OnChange hears of every freeze and thaw of a gate that freezes,
	// the slots frozen at the time first whenever the client (re)attaches
	// to a gate; it must not block for long.
	OnChange func(slotgate.Change)
}

// callTimeout bounds one control request; startTimeout a new gate's
// start until it answers.
const (
	callTimeout  = 5 * time.Second
	startTimeout = 10 * time.Second
)

// Client is the node agent's side of its gate process. It keeps the
// slots' occupants and makes sure the gate that serves knows them: told
// before Start only, they are delivered by Start (once the agent adopted
// its slots); after it, each Occupy returns once the gate applied it, or
// once no gate that could still admit for the slot's previous occupant
// runs (the gate is killed and another started with every occupant).
type Client struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// listen is where a gate this client starts listens; fixed says it
	// was asked for: a running gate elsewhere is replaced.
	listen string
	fixed  bool
	table  map[string]occupant // by worker
	synced bool
	conn   net.Conn
	r      *bufio.Reader
	pid    int
	// proc is the gate process when this client started it (to reap).
	proc *os.Process
	addr string
	// gen counts the gates this client has talked to, so a watch that
	// saw one end does not replace its successor.
	gen int
	// freezes: the gate freezes idle slots (reply.Freezes).
	freezes bool
}

type occupant struct {
	ip, actor string
	freeze    slotgate.Freeze
	// holds are the agent's holds on the slot, taken again from a gate
	// that replaces the one they were taken from.
	holds int
}

// NewClient returns a client that knows no occupant and no gate yet.
func NewClient(cfg Config) *Client {
	return &Client{cfg: cfg, log: cfg.Logger, table: map[string]occupant{}}
}

// Occupy records that worker (its workloads on ip) hosts actorUID ("" for
// none), frozen when idle as f says, and, once Start ran, delivers it:
// see Client.
func (c *Client) Occupy(worker, ip, actorUID string, f slotgate.Freeze) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.table[worker]
	o.ip, o.actor, o.freeze = ip, actorUID, f
	c.table[worker] = o
	if !c.synced {
		return
	}
	if c.conn != nil {
		err := c.occupy(worker, c.table[worker])
		if err == nil {
			return
		}
		c.log.Error("slot gate did not apply an occupant; replacing the gate (its connections are cut)", "worker", worker, "actor_uid", actorUID, "err", err)
	}
	c.replace()
}

// Hold thaws worker's slot and keeps it from freezing until release
// (slotgate.Gate.Hold). With no gate, or one that does not freeze,
// nothing is frozen and the hold is trivially kept.
func (c *Client) Hold(worker string) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o, ok := c.table[worker]
	if !ok {
		return func() {}, nil
	}
	if c.conn != nil && c.freezes {
		if err := c.call(request{Op: opHold, Worker: worker}, nil); err != nil {
			return nil, fmt.Errorf("worker %s: %w", worker, err)
		}
	}
	o.holds++
	c.table[worker] = o
	var once sync.Once
	return func() { once.Do(func() { c.release(worker) }) }, nil
}

func (c *Client) release(worker string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.table[worker]
	if o.holds > 0 {
		o.holds--
		c.table[worker] = o
	}
	if c.conn != nil && c.freezes {
		if err := c.call(request{Op: opRelease, Worker: worker}, nil); err != nil {
			c.log.Warn("slot gate: hold not released (the gate is replaced, which releases it)", "worker", worker, "err", err)
		}
	}
}

// Start connects to the gate a previous agent left running if it speaks
// this version (and listens on listen if fixed), else starts one on
// listen, tells it every occupant and has it serve. It returns the gate's
// address.
func (c *Client) Start(ctx context.Context, listen string, fixed bool) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.synced, c.listen, c.fixed = true, listen, fixed
	if err := c.adopt(); err == nil {
		c.log.Info("adopted the running slot gate: its connections go on", "addr", c.addr, "pid", c.pid)
		return c.addr, nil
	} else if !errors.Is(err, errNoGate) {
		c.log.Warn("replacing the running slot gate: its connections are cut", "err", err)
	}
	if err := c.stopRunning(); err != nil {
		return "", err
	}
	if err := c.launch(ctx); err != nil {
		return "", err
	}
	c.log.Info("started the slot gate", "addr", c.addr, "pid", c.pid)
	return c.addr, nil
}

var errNoGate = errors.New("no slot gate runs")

// adopt takes over the gate that answers on the socket, if it fits.
func (c *Client) adopt() error {
	conn, r, hello, err := dial(c.cfg.StateDir)
	if err != nil {
		return fmt.Errorf("%w: %w", errNoGate, err)
	}
	switch {
	case hello.Version != Version:
		err = fmt.Errorf("it speaks version %d, this agent %d", hello.Version, Version)
	case c.fixed && !sameAddr(hello.Addr, c.listen):
		err = fmt.Errorf("it listens on %s, not on %s", hello.Addr, c.listen)
	}
	if err != nil {
		// Killed by the caller, by its pid file: an exit would race the
		// start of its successor for the state directory's lock.
		conn.Close()
		return err
	}
	c.use(conn, r, hello, nil)
	return c.sync()
}

// Supervise watches the gate until ctx ends: a gate that dies is
// replaced (the connections it held are lost) and told every occupant.
func (c *Client) Supervise(ctx context.Context) error {
	for {
		c.mu.Lock()
		gen := c.gen
		conn, r, hello, err := dial(c.cfg.StateDir)
		c.mu.Unlock()
		if err == nil {
			stop := context.AfterFunc(ctx, func() { conn.Close() })
			c.watch(conn, r, hello)
			stop()
			conn.Close()
		}
		if ctx.Err() != nil {
			return nil
		}
		c.mu.Lock()
		if c.gen == gen {
			c.log.Error("the slot gate process is gone: starting another; the connections it held are lost")
			c.replace()
		}
		failed := c.conn == nil
		c.mu.Unlock()
		if failed {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
		}
	}
}

// watch reads the gate's freezes and thaws from conn, when it freezes,
// or else waits for it to end (such a gate never writes on the
// connection), and returns when the gate or conn ends.
func (c *Client) watch(conn net.Conn, r *bufio.Reader, hello reply) {
	if !hello.Freezes || c.cfg.OnChange == nil {
		_, _ = conn.Read(make([]byte, 1))
		return
	}
	if err := call(conn, r, request{Op: opWatch}, nil); err != nil {
		return
	}
	for {
		var ch change
		if err := readMessage(r, &ch); err != nil {
			return
		}
		c.cfg.OnChange(slotgate.Change{Worker: ch.Worker, ActorUID: ch.Actor, Frozen: ch.Frozen, Time: ch.Time})
	}
}

// Exit stops the gate (the agent stops with no workload left): its
// listener and connections close, and it is gone when Exit returns.
func (c *Client) Exit() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return c.stopRunning()
	}
	if err := c.call(request{Op: opExit}, nil); err != nil {
		c.log.Warn("slot gate did not take the exit; killing it", "err", err)
		return c.stopRunning()
	}
	pid, proc := c.pid, c.proc
	c.closeConn()
	if err := gone(pid, proc, startTimeout); err != nil {
		return kill(pid, proc)
	}
	return nil
}

// Detach leaves the gate serving (the agent stops with workloads running:
// their connections go on) and lets go of it.
func (c *Client) Detach() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeConn()
	if c.proc != nil {
		_ = c.proc.Release()
		c.proc = nil
	}
}

// replace kills the gate (if one runs) and starts another with every
// occupant; it is how an occupant that could not be delivered still is.
// c.mu is held.
func (c *Client) replace() {
	if err := c.stopRunning(); err != nil {
		// A gate that cannot be killed still admits: nothing else may
		// listen on its address either, so starting another is futile.
		c.log.Error("slot gate", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := c.launch(ctx); err != nil {
		c.log.Error("slot gate could not be started again; routed connections to this node fail until it is", "err", err)
		return
	}
	c.log.Info("started the slot gate again", "addr", c.addr, "pid", c.pid)
}

// stopRunning kills the gate this client talks to, or the one the pid
// file names, and returns once none runs. c.mu is held.
func (c *Client) stopRunning() error {
	pid, proc := c.pid, c.proc
	c.closeConn()
	if pid == 0 {
		var ok bool
		if pid, ok = running(c.cfg.StateDir); !ok {
			return nil
		}
	}
	return kill(pid, proc)
}

// launch starts a gate on the configured address (else the last one's)
// and tells it every occupant. c.mu is held.
func (c *Client) launch(ctx context.Context) error {
	listen := c.listen
	if !c.fixed && c.addr != "" {
		listen = c.addr
	}
	proc, err := spawn(c.cfg.Command, c.cfg.StateDir, listen)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		conn, r, hello, err := dial(c.cfg.StateDir)
		if err == nil && hello.PID == proc.Pid {
			c.use(conn, r, hello, proc)
			return c.sync()
		}
		if conn != nil {
			conn.Close()
		}
		if !alive(proc.Pid) {
			_, _ = proc.Wait()
			return fmt.Errorf("slot gate exited at its start (see %s)", logPathOf(c.cfg.StateDir))
		}
		select {
		case <-ctx.Done():
			_ = kill(proc.Pid, proc)
			return fmt.Errorf("slot gate did not answer within %s of its start (see %s): %w", startTimeout, logPathOf(c.cfg.StateDir), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// use makes conn the connection to the gate hello describes. c.mu is held.
func (c *Client) use(conn net.Conn, r *bufio.Reader, hello reply, proc *os.Process) {
	c.conn, c.r, c.pid, c.proc, c.addr, c.freezes = conn, r, hello.PID, proc, hello.Addr, hello.Freezes
	c.gen++
}

// sync tells the gate every occupant, then has it serve. c.mu is held.
func (c *Client) sync() error {
	workers := make([]string, 0, len(c.table))
	for w := range c.table {
		workers = append(workers, w)
	}
	sort.Strings(workers)
	for _, w := range workers {
		if err := c.occupy(w, c.table[w]); err != nil {
			return err
		}
		for range c.table[w].holds {
			if !c.freezes {
				break
			}
			if err := c.call(request{Op: opHold, Worker: w}, nil); err != nil {
				return err
			}
		}
	}
	return c.call(request{Op: opServe}, nil)
}

func (c *Client) occupy(worker string, o occupant) error {
	return c.call(request{Op: opOccupy, Worker: worker, IP: o.ip, Actor: o.actor, FreezeAfterMS: o.freeze.After.Milliseconds(), Control: o.freeze.Control}, nil)
}

// call sends req on the client's connection; a connection that fails is
// dropped. c.mu is held.
func (c *Client) call(req request, rep *reply) error {
	if c.conn == nil {
		return errNoGate
	}
	if err := call(c.conn, c.r, req, rep); err != nil {
		c.closeConn()
		return err
	}
	return nil
}

func (c *Client) closeConn() {
	if c.conn != nil {
		c.conn.Close()
	}
	c.conn, c.r, c.pid, c.proc = nil, nil, 0, nil
}

// dial connects to the gate's control socket and says hello.
func dial(stateDir string) (net.Conn, *bufio.Reader, reply, error) {
	conn, err := net.DialTimeout("unix", SocketPath(stateDir), callTimeout)
	if err != nil {
		return nil, nil, reply{}, err
	}
	r := bufio.NewReaderSize(conn, maxMessage)
	var hello reply
	if err := call(conn, r, request{Op: opHello, Version: Version}, &hello); err != nil {
		conn.Close()
		return nil, nil, reply{}, err
	}
	return conn, r, hello, nil
}

// call sends one request and reads its reply into rep (when set).
func call(conn net.Conn, r *bufio.Reader, req request, rep *reply) error {
	_ = conn.SetDeadline(time.Now().Add(callTimeout))
	defer conn.SetDeadline(time.Time{}) //nolint:errcheck // a closed connection fails the next call
	if err := writeMessage(conn, req); err != nil {
		return fmt.Errorf("slot gate: %s: %w", req.Op, err)
	}
	var got reply
	if err := readMessage(r, &got); err != nil {
		return fmt.Errorf("slot gate: %s: %w", req.Op, err)
	}
	if got.Error != "" {
		return fmt.Errorf("slot gate: %s: %s", req.Op, got.Error)
	}
	if rep != nil {
		*rep = got
	}
	return nil
}

// sameAddr says whether the gate's address a is the one asked for (an
// empty or unspecified host matches any).
func sameAddr(a, asked string) bool {
	ah, ap, err1 := net.SplitHostPort(a)
	bh, bp, err2 := net.SplitHostPort(asked)
	if err1 != nil || err2 != nil || ap != bp {
		return a == asked
	}
	unspecified := func(h string) bool { ip := net.ParseIP(h); return h == "" || (ip != nil && ip.IsUnspecified()) }
	return ah == bh || unspecified(bh) && unspecified(ah) || net.ParseIP(ah).Equal(net.ParseIP(bh))
}

func logPathOf(stateDir string) string { return filepath.Join(stateDir, logFile) }
