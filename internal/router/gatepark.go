package router

// A request for a RUNNING actor whose node's slot gate cannot be reached
// (refused, reset or timed out before the gate answered its handshake:
// the node agent hosting the gate is restarting, or the node is briefly
// out of reach) has sent nothing, so it waits instead of failing: it is
// parked as requests waiting for a resume are, within ParkTimeout from its
// first failure and with the same backoff, asking the control plane where
// the actor runs before each try (it may have been crashed meanwhile and
// resumed elsewhere), and is sent when a gate admits it. Tunnels, sandbox
// routes and upgrade requests wait the same way.
//
// A request the gate admitted may have reached the workload before the
// connection was cut. It is sent once more only when that cannot do
// harm: nothing of an answer reached the client yet, the router still
// holds what it read of the body (maxReplay), and the method is
// idempotent (RFC 9110: GET, HEAD, OPTIONS, TRACE, PUT, DELETE) or the
// request carries an Idempotency-Key header, by which its client says a
// repeat is safe (the header Go's own HTTP client honours for its
// retries). Upgrades and tunnels are never sent again: what follows them
// is a conversation, not a request.

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/torpor-dev/torpor/internal/retry"
	"github.com/torpor-dev/torpor/internal/slotgate"
)

// errGateDown: the slot gate of the actor's node did not answer for the
// whole park bound.
var errGateDown = errors.New("the node it runs on does not answer")

// gateDownErr reports whether err, from slotgate.Dial, says the gate was
// not reached or did not finish its handshake (an answer, stale or
// unreachable, is not that): nothing was sent.
func gateDownErr(err error) bool {
	if err == nil || errors.Is(err, slotgate.ErrStale) || errors.Is(err, slotgate.ErrUnreachable) {
		return false
	}
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// gatePark is the wait of one request whose actor's gate did not answer.
// The zero value has not waited yet.
type gatePark struct {
	b        *retry.Backoff
	deadline time.Time
}

// waitGate waits before the request tries its actor's gate again. It
// returns false when the park bound is spent or the client left.
func (r *Router) waitGate(ctx context.Context, p *gatePark) bool {
	if p.b == nil {
		p.b, p.deadline = parkBackoff.Start(), time.Now().Add(r.cfg.ParkTimeout)
		r.metrics.gateParks.Inc()
	}
	ctx, cancel := context.WithDeadline(ctx, p.deadline)
	defer cancel()
	r.metrics.parked.Inc()
	defer r.metrics.parked.Dec()
	return p.b.Wait(ctx)
}

// replayable reports whether req, which may have reached its workload,
// may be sent again (see above).
func replayable(req *http.Request) bool {
	if req.Method == http.MethodConnect || req.Header.Get("Upgrade") != "" {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return req.Header.Get("Idempotency-Key") != ""
}
