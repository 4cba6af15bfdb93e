package router

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// heldBody is a request's body as one proxy attempt's transport reads it.
// The transport writes a request in a goroutine of its own, which may
// still be in a Read of the client's body when the attempt has failed (the
// workload closed the connection before it took the whole body): the
// handler must not return then, as the server reads the client's
// connection itself once the handler is done, and two reads of one
// connection at once make it panic. release ends the attempt's reads.
type heldBody struct {
	mu       sync.Mutex // held by a Read under way
	body     io.ReadCloser
	released atomic.Bool
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
	return b.body.Read(p)
}

// Close leaves the client's body to the handler: a later attempt, or the
// server, reads or discards the rest.
func (b *heldBody) Close() error { return nil }

// release waits until no Read is under way and makes later ones fail. A
// Read blocked on a client that sends nothing more is woken by ending the
// connection's read deadline: the attempt that read it is over, and the
// connection, with part of a body unread, cannot be reused anyway.
func (b *heldBody) release(w http.ResponseWriter) {
	b.released.Store(true)
	if !b.mu.TryLock() {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		b.mu.Lock()
	}
	b.mu.Unlock()
}
