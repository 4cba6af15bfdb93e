package router

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// maxReplay bounds the start of a request body the router keeps while an
// attempt reads it, so that a request cut before any answer (its node
// agent restarting) can be sent again: a body read further than this is
// not replayed.
const maxReplay = 64 << 10

// heldBody is a request's body as one proxy attempt's transport reads it.
// The transport writes a request in a goroutine of its own, which may
// still be in a Read of the client's body when the attempt has failed (the
// workload closed the connection before it took the whole body): the
// handler must not return then, as the server reads the client's
// connection itself once the handler is done, and two reads of one
// connection at once make it panic. release ends the attempt's reads.
type heldBody struct {
	mu       sync.Mutex // held by a Read under way
	body     io.Reader
	released atomic.Bool
	// kept is what the attempt read, while lost is false: it read more
	// than maxReplay, or release cut a read of the client's connection.
	kept []byte
	lost bool
}

// holdBody returns the body of req for its first attempt; nil when it
// has none.
func holdBody(req *http.Request) *heldBody {
	if req.Body == nil || req.Body == http.NoBody {
		return nil
	}
	return &heldBody{body: req.Body}
}

func (b *heldBody) Read(p []byte) (int, error) {
	if b.released.Load() {
		return 0, http.ErrBodyReadAfterClose
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.released.Load() {
		return 0, http.ErrBodyReadAfterClose
	}
	n, err := b.body.Read(p)
	if !b.lost {
		if len(b.kept)+n > maxReplay {
			b.lost, b.kept = true, nil
		} else {
			b.kept = append(b.kept, p[:n]...)
		}
	}
	return n, err
}

// Close leaves the client's body to the handler: a later attempt, or the
// server, reads or discards the rest.
func (b *heldBody) Close() error { return nil }

// release waits until no Read is under way and makes later ones fail. A
// Read blocked on a client that sends nothing more is woken by ending the
// connection's read deadline: the attempt that read it is over, and the
// connection, with part of a body unread, cannot be reused anyway.
func (b *heldBody) release(w http.ResponseWriter) {
	if b == nil {
		return
	}
	b.released.Store(true)
	if !b.mu.TryLock() {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		b.mu.Lock()
		b.lost = true
	}
	b.mu.Unlock()
}

// again is the body for the next attempt of the request, once this one
// is released: what this attempt read, then the rest of the client's.
// ok is false when this attempt read more than it kept. A request without
// a body (nil) has one again.
func (b *heldBody) again() (next *heldBody, ok bool) {
	if b == nil {
		return nil, true
	}
	if b.lost {
		return nil, false
	}
	return &heldBody{body: io.MultiReader(bytes.NewReader(b.kept), b.body)}, true
}
