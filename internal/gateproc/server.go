package gateproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/internal/slotgate"
)

// occupier is what the control server changes: slotgate.Gate.
type occupier interface {
	Occupy(worker, ip, actorUID string, f slotgate.Freeze)
	Hold(worker string) (release func(), err error)
	States() []slotgate.Change
}

// watchBuffer bounds the changes waiting for one watcher.
const watchBuffer = 256

// control serves the control protocol for one gate process.
type control struct {
	log  *slog.Logger
	gate occupier
	addr string
	// serve starts the gate accepting (once; later calls do nothing).
	serve func()
	// exit stops the process once the reply to opExit is written.
	exit func()

	mu       sync.Mutex
	serving  bool
	watchers map[chan slotgate.Change]struct{}
}

// notify hands a freeze or thaw to every watcher; one whose buffer is
// full is cut (closed channel), not waited for.
func (c *control) notify(ch slotgate.Change) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for w := range c.watchers {
		select {
		case w <- ch:
		default:
			close(w)
			delete(c.watchers, w)
		}
	}
}

// watch writes the state of every slot that freezes, then every change, to conn until
// it or the gate ends.
func (c *control) watch(conn net.Conn) error {
	ch := make(chan slotgate.Change, watchBuffer)
	c.mu.Lock()
	if c.watchers == nil {
		c.watchers = map[chan slotgate.Change]struct{}{}
	}
	c.watchers[ch] = struct{}{}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if _, ok := c.watchers[ch]; ok {
			delete(c.watchers, ch)
			close(ch)
		}
		c.mu.Unlock()
	}()
	// A change may be both in the list and in the channel: a watcher
	// takes the last word per slot.
	for _, fc := range c.gate.States() {
		if err := writeMessage(conn, toChange(fc)); err != nil {
			return err
		}
	}
	for fc := range ch {
		if err := writeMessage(conn, toChange(fc)); err != nil {
			return err
		}
	}
	return fmt.Errorf("gate control: watcher fell %d changes behind; cut", watchBuffer)
}

func toChange(c slotgate.Change) change {
	return change{Worker: c.Worker, Actor: c.ActorUID, Frozen: c.Frozen, Time: c.Time}
}

// Serve answers control connections from ln until ctx ends, then closes
// ln and them, and returns once every connection's goroutine is done.
func (c *control) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("gate control on %s: %w", ln.Addr(), err)
		}
		wg.Go(func() {
			done := context.AfterFunc(ctx, func() { conn.Close() })
			defer done()
			defer conn.Close()
			if err := c.handle(conn); err != nil && ctx.Err() == nil {
				c.log.Warn("gate control connection ended", "err", err)
			}
		})
	}
}

// handle answers one connection's requests in order until it closes. An
// agent keeps one connection for its requests and another it only reads,
// to learn at once that the gate is gone.
// Holds taken on a connection are released when it ends (an agent that
// dies lets its slots freeze again).
func (c *control) handle(conn net.Conn) error {
	r := bufio.NewReaderSize(conn, maxMessage)
	holds := map[string][]func(){}
	defer func() {
		for _, rs := range holds {
			for _, release := range rs {
				release()
			}
		}
	}()
	for {
		var req request
		if err := readMessage(r, &req); err != nil {
			if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) || isEOF(err) {
				return nil
			}
			return err
		}
		var rep reply
		var after func()
		switch req.Op {
		case opHold:
			release, err := c.gate.Hold(req.Worker)
			if err != nil {
				rep.Error = err.Error()
			} else {
				holds[req.Worker] = append(holds[req.Worker], release)
			}
		case opRelease:
			// A release with no hold on this connection (its gate was
			// replaced since) has nothing to do.
			if rs := holds[req.Worker]; len(rs) > 0 {
				rs[len(rs)-1]()
				holds[req.Worker] = rs[:len(rs)-1]
			}
		case opWatch:
			if err := writeMessage(conn, reply{}); err != nil {
				return err
			}
			return c.watch(conn)
		default:
			rep, after = c.answer(req)
		}
		if err := writeMessage(conn, rep); err != nil {
			return fmt.Errorf("gate control: reply to %s: %w", req.Op, err)
		}
		if after != nil {
			after()
		}
	}
}

// answer applies req and returns its reply, and what to do once the reply
// is sent.
func (c *control) answer(req request) (reply, func()) {
	switch req.Op {
	case opHello:
		c.mu.Lock()
		defer c.mu.Unlock()
		return reply{Version: Version, PID: os.Getpid(), Addr: c.addr, Serving: c.serving, Freezes: true}, nil
	case opOccupy:
		if req.Worker == "" {
			return reply{Error: "occupy: worker required"}, nil
		}
		c.gate.Occupy(req.Worker, req.IP, req.Actor, slotgate.Freeze{After: time.Duration(req.FreezeAfterMS) * time.Millisecond, Control: req.Control})
		return reply{}, nil
	case opServe:
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.serving {
			c.serving = true
			c.serve()
			c.log.Info("slot gate serving", "addr", c.addr)
		}
		return reply{Serving: true}, nil
	case opExit:
		c.log.Info("slot gate exiting, as the node agent asked")
		return reply{}, c.exit
	default:
		return reply{Error: fmt.Sprintf("unknown op %q", req.Op)}, nil
	}
}
