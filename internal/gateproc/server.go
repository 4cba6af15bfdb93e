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
)

// occupier is what the control server changes: slotgate.Gate.
type occupier interface {
	Occupy(worker, ip, actorUID string)
}

// control serves the control protocol for one gate process.
type control struct {
	log  *slog.Logger
	gate occupier
	addr string
	// serve starts the gate accepting (once; later calls do nothing).
	serve func()
	// exit stops the process once the reply to opExit is written.
	exit func()

	mu      sync.Mutex
	serving bool
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
func (c *control) handle(conn net.Conn) error {
	r := bufio.NewReaderSize(conn, maxMessage)
	for {
		var req request
		if err := readMessage(r, &req); err != nil {
			if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) || isEOF(err) {
				return nil
			}
			return err
		}
		rep, after := c.answer(req)
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
		return reply{Version: Version, PID: os.Getpid(), Addr: c.addr, Serving: c.serving}, nil
	case opOccupy:
		if req.Worker == "" {
			return reply{Error: "occupy: worker required"}, nil
		}
		c.gate.Occupy(req.Worker, req.IP, req.Actor)
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
