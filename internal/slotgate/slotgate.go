// Package slotgate is the node's side of its worker slots for routed
// traffic: a TCP listener that admits a connection only for the actor its
// slot hosts at that moment, and closes every connection it admitted for
// an actor as soon as the slot stops hosting it.
//
// A router names, when it connects, the worker, the actor's uid and the
// port it wants (Dial). The gate checks that the worker hosts that actor,
// connects to the workload and only then answers OK; otherwise it answers
// why not (ErrStale, ErrUnreachable) and closes. An address a router kept
// after the actor moved, however old, therefore reaches no other actor:
// the guarantee rests on the node's own record of its slots, not on how
// fast the router learns of the move. The node calls Occupy before a new
// workload starts in a slot (its claim), so a connection admitted for the
// slot's previous actor is closed before anything else listens there.
//
// The gate routes; it does not authenticate. It is as reachable as the
// worker addresses it forwards to, and an operator exposes it the same way
// (see docs/operations.md).
package slotgate

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
	"sync/atomic"
	"time"
)

// magic starts every request line, naming the protocol and its version.
const magic = "TORPOR-GATE/1"

// Answers of the gate, the first word of its reply line.
const (
	answerOK          = "OK"
	answerStale       = "STALE"
	answerUnreachable = "UNREACHABLE"
	answerBad         = "BAD" // a request the gate cannot read
)

// maxLine bounds a request or reply line: a worker name, a uid and a
// port, with room to spare.
const maxLine = 512

// handshakeTimeout bounds how long either side waits for the other's line,
// and the gate's connection to the workload.
const handshakeTimeout = 5 * time.Second

var (
	// ErrStale: the worker does not host the actor (any more): the caller's
	// placement is out of date and nothing was sent.
	ErrStale = errors.New("the worker does not host the actor")
	// ErrUnreachable: the worker hosts the actor but nothing answers on
	// the port; nothing was sent.
	ErrUnreachable = errors.New("the actor's workload does not accept connections")
)

// Target is one port of one actor behind a node's gate.
type Target struct {
	// Gate is the node gate's host:port.
	Gate     string
	Worker   string
	ActorUID string
	Port     int
}

func (t Target) String() string {
	return fmt.Sprintf("actor %s on worker %s port %d via %s", t.ActorUID, t.Worker, t.Port, t.Gate)
}

func (t Target) check() error {
	for _, f := range []struct{ name, v string }{{"worker", t.Worker}, {"actor uid", t.ActorUID}} {
		if f.v == "" || strings.ContainsAny(f.v, " \r\n") {
			return fmt.Errorf("gate target: %s %q must be one word", f.name, f.v)
		}
	}
	if t.Port <= 0 || t.Port > 65535 {
		return fmt.Errorf("gate target: port %d out of range", t.Port)
	}
	return nil
}

// Dial connects to t through its gate. The connection it returns reaches
// t's workload, and only while t's worker hosts that actor. A refusal is
// ErrStale or ErrUnreachable (wrapped); either way nothing was sent.
func Dial(ctx context.Context, d *net.Dialer, t Target) (net.Conn, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	conn, err := d.DialContext(ctx, "tcp", t.Gate)
	if err != nil {
		return nil, fmt.Errorf("gate of %s: %w", t, err)
	}
	deadline := time.Now().Add(handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	answer, err := handshake(conn, t)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("gate of %s: %w", t, err)
	}
	word, why, _ := strings.Cut(answer, " ")
	switch word {
	case answerOK:
		_ = conn.SetDeadline(time.Time{})
		return conn, nil
	case answerStale:
		err = fmt.Errorf("%s: %w (%s)", t, ErrStale, why)
	case answerUnreachable:
		err = fmt.Errorf("%s: %w (%s)", t, ErrUnreachable, why)
	default:
		err = fmt.Errorf("gate of %s answered %q", t, answer)
	}
	conn.Close()
	return nil, err
}

func handshake(conn net.Conn, t Target) (string, error) {
	if _, err := fmt.Fprintf(conn, "%s %s %s %d\n", magic, t.Worker, t.ActorUID, t.Port); err != nil {
		return "", err
	}
	return readLine(conn)
}

// readLine reads one line a byte at a time: whatever follows it belongs
// to the spliced stream (a workload may speak first) and must stay unread.
func readLine(r io.Reader) (string, error) {
	var b strings.Builder
	var c [1]byte
	for b.Len() < maxLine {
		if _, err := io.ReadFull(r, c[:]); err != nil {
			return "", err
		}
		if c[0] == '\n' {
			return b.String(), nil
		}
		b.WriteByte(c[0])
	}
	return "", fmt.Errorf("line longer than %d bytes", maxLine)
}

// Gate admits connections to the actors its slots host.
type Gate struct {
	log    *slog.Logger
	dialer net.Dialer
	opts   Options

	mu    sync.Mutex
	slots map[string]*occupant // by worker name
}

// occupant is the actor a slot hosts and the connections admitted for it.
type occupant struct {
	ip       string
	actorUID string
	conns    map[*pair]struct{}
	// freeze is set when the occupant freezes when idle (freeze.go).
	freeze atomic.Pointer[freezer]
}

// pair is one admitted connection: the router's side and the workload's.
type pair struct {
	down, up net.Conn
	closed   bool // by Occupy: up, once dialled, must be closed unused
	// asked and answered are when bytes last came from the router's side
	// and from the workload's (unix nanos; set on a freezing slot only):
	// asked after answered is a request the workload still owes an
	// answer to, which keeps the slot from freezing (freeze.go).
	asked, answered atomic.Int64
}

// close ends both sides; g.mu is held.
func (p *pair) close() {
	p.closed = true
	p.down.Close()
	if p.up != nil {
		p.up.Close()
	}
}

// New returns a gate whose slots host nothing.
func New(log *slog.Logger, opts Options) *Gate {
	return &Gate{log: log, dialer: net.Dialer{Timeout: handshakeTimeout}, opts: opts, slots: map[string]*occupant{}}
}

// Occupy records that worker, whose workloads listen on ip, hosts
// actorUID ("" for none), frozen when idle as f says. When that changes
// the slot's actor, every connection admitted for the previous one is
// closed before Occupy returns; when only f changes, the connections
// stay and the slot is thawed first.
func (g *Gate) Occupy(worker, ip, actorUID string, f Freeze) {
	g.mu.Lock()
	defer g.mu.Unlock()
	occ := g.slots[worker]
	if occ != nil && occ.actorUID == actorUID && occ.ip == ip {
		old := occ.freeze.Load()
		if g.freezesAs(old, f) {
			return
		}
		if old != nil {
			// The same workload, frozen another way from now on: thawed
			// by the old state's owner before the new one takes over.
			old.mu.Lock()
			if err := g.thawLocked(worker, actorUID, old); err != nil {
				g.log.Error("slot not thawed for a new freeze setting", "worker", worker, "actor_uid", actorUID, "err", err)
			}
			old.mu.Unlock()
			g.retire(worker, old)
		}
		occ.freeze.Store(g.newFreezer(worker, actorUID, f))
		return
	}
	if occ != nil {
		for p := range occ.conns {
			p.close()
		}
		g.retire(worker, occ.freeze.Load())
	}
	next := &occupant{ip: ip, actorUID: actorUID, conns: map[*pair]struct{}{}}
	if actorUID != "" {
		next.freeze.Store(g.newFreezer(worker, actorUID, f))
	} else {
		g.unmark(worker)
	}
	g.slots[worker] = next
}

// Serve admits connections from ln until ctx ends, then closes ln and
// every connection it admitted.
func (g *Gate) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	freezing, stopFreezing := context.WithCancel(ctx)
	wg.Go(func() { g.freezeLoop(freezing) })
	defer func() {
		stopFreezing()
		g.mu.Lock()
		for _, occ := range g.slots {
			for p := range occ.conns {
				p.close()
			}
		}
		g.mu.Unlock()
		wg.Wait()
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("slot gate on %s: %w", ln.Addr(), err)
		}
		wg.Go(func() { g.handle(ctx, conn) })
	}
}

func (g *Gate) handle(ctx context.Context, down net.Conn) {
	_ = down.SetDeadline(time.Now().Add(handshakeTimeout))
	line, err := readLine(down)
	if err != nil {
		g.log.Debug("slot gate: no request", "peer", down.RemoteAddr().String(), "err", err)
		down.Close()
		return
	}
	t, err := parseRequest(line)
	if err != nil {
		g.refuse(down, answerBad, err)
		return
	}
	p, occ, err := g.admit(down, t)
	if err != nil {
		g.refuse(down, answerStale, err)
		return
	}
	defer g.forget(t.Worker, p)
	g.awake(t.Worker, occ)
	up, err := g.dialer.DialContext(ctx, "tcp", net.JoinHostPort(occ.ip, strconv.Itoa(t.Port)))
	if err != nil {
		g.refuse(down, answerUnreachable, err)
		return
	}
	g.mu.Lock()
	closed := p.closed
	if !closed {
		p.up = up
	}
	g.mu.Unlock()
	if closed {
		// The slot changed hands while the workload was dialled: what
		// answered may already be the next actor's.
		up.Close()
		g.refuse(down, answerStale, fmt.Errorf("worker %s changed hands", t.Worker))
		return
	}
	if _, err := io.WriteString(down, answerOK+"\n"); err != nil {
		p.closeBoth(g)
		return
	}
	_ = down.SetDeadline(time.Time{})
	if occ.freeze.Load() == nil {
		splice(down, up)
	} else {
		// Each read thaws the slot before its bytes pass (freeze.go),
		// which the kernel's splice would not let the gate see.
		asked := func() { p.asked.Store(time.Now().UnixNano()); g.awake(t.Worker, occ) }
		answered := func() { p.answered.Store(time.Now().UnixNano()); g.awake(t.Worker, occ) }
		splice(waking{down, asked}, waking{up, answered})
	}
	p.closeBoth(g)
}

func parseRequest(line string) (Target, error) {
	f := strings.Fields(line)
	if len(f) != 4 || f[0] != magic {
		return Target{}, fmt.Errorf("malformed request %q", line)
	}
	port, err := strconv.Atoi(f[3])
	if err != nil {
		return Target{}, fmt.Errorf("malformed request %q: port: %w", line, err)
	}
	t := Target{Worker: f[1], ActorUID: f[2], Port: port}
	return t, t.check()
}

// admit registers the connection with the occupant of t's slot if that is
// t's actor, and returns it.
func (g *Gate) admit(down net.Conn, t Target) (*pair, *occupant, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	occ := g.slots[t.Worker]
	switch {
	case occ == nil:
		return nil, nil, fmt.Errorf("no worker %s on this node", t.Worker)
	case occ.actorUID != t.ActorUID:
		return nil, nil, fmt.Errorf("worker %s does not host actor %s", t.Worker, t.ActorUID)
	}
	p := &pair{down: down}
	occ.conns[p] = struct{}{}
	return p, occ, nil
}

func (g *Gate) forget(worker string, p *pair) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if occ := g.slots[worker]; occ != nil {
		delete(occ.conns, p)
	}
}

func (p *pair) closeBoth(g *Gate) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p.close()
}

func (g *Gate) refuse(down net.Conn, answer string, why error) {
	g.log.Debug("slot gate: refused", "peer", down.RemoteAddr().String(), "answer", answer, "err", why)
	msg := strings.ReplaceAll(why.Error(), "\n", " ")
	if len(msg) > maxLine-len(answer)-2 {
		msg = msg[:maxLine-len(answer)-2]
	}
	_, _ = io.WriteString(down, answer+" "+msg+"\n")
	down.Close()
}

// splice copies both ways until either side ends, then half-closes the
// other's writing side so a peer waiting for the end of a request or
// answer gets it; it returns when both directions are done.
func splice(down, up net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
		done <- struct{}{}
	}
	go cp(up, down)
	go cp(down, up)
	<-done
	<-done
}

// waking is one side of a spliced connection that calls wake after each
// read, before the bytes read are written on.
type waking struct {
	net.Conn
	wake func()
}

func (w waking) Read(b []byte) (int, error) {
	n, err := w.Conn.Read(b)
	if n > 0 {
		w.wake()
	}
	return n, err
}

func (w waking) CloseWrite() error {
	if cw, ok := w.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return w.Conn.Close()
}
