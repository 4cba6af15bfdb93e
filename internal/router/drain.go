package router

// Draining: a router being stopped (SIGTERM) first says so on /healthz
// (503 "draining"), so that a load balancer sends new clients elsewhere,
// while its server finishes the requests in flight (httpserve.ServeGrace).
// Connections taken over by an upgrade (WebSocket) or a tunnel are the
// router's own from then on, which http.Server.Shutdown does not track:
// the router keeps them, and CloseHijacked ends those still open when the
// grace period is over.

import (
	"context"
	"net"
	"sync"
	"time"
)

// hijackedConns are the client connections upgrades and tunnels took over.
type hijackedConns struct {
	mu sync.Mutex
	m  map[*hijackedConn]struct{}
}

type hijackedConn struct {
	*countingConn
	owner *hijackedConns
	once  sync.Once
}

func (c *hijackedConn) Close() error {
	c.once.Do(func() {
		c.owner.mu.Lock()
		delete(c.owner.m, c)
		c.owner.mu.Unlock()
	})
	return c.countingConn.Close()
}

// keep tracks conn until it is closed.
func (h *hijackedConns) keep(conn *countingConn) net.Conn {
	c := &hijackedConn{countingConn: conn, owner: h}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[*hijackedConn]struct{}{}
	}
	h.m[c] = struct{}{}
	return c
}

func (h *hijackedConns) open() []*hijackedConn {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*hijackedConn, 0, len(h.m))
	for c := range h.m {
		out = append(out, c)
	}
	return out
}

// Drain makes /healthz answer 503 "draining" from now on: the router is
// being stopped.
func (r *Router) Drain() { r.draining.Store(true) }

// hijackPoll is how often CloseHijacked looks whether the upgraded
// connections and tunnels ended on their own.
const hijackPoll = 50 * time.Millisecond

// CloseHijacked waits until the upgraded connections and tunnels ended
// on their own or ctx ends, then closes those still open and returns how
// many it closed.
func (r *Router) CloseHijacked(ctx context.Context) int {
	tick := time.NewTicker(hijackPoll)
	defer tick.Stop()
	for len(r.hijacked.open()) > 0 {
		select {
		case <-ctx.Done():
			open := r.hijacked.open()
			for _, c := range open {
				c.Close()
			}
			return len(open)
		case <-tick.C:
		}
	}
	return 0
}
