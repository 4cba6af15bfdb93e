package router

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"
)

// TestHeldBodyRelease: a proxy attempt's transport blocked reading a
// client's body that stops half way is woken when the attempt ends, so the
// handler can return without the server and the transport reading the
// connection at once; the transport's later reads fail.
func TestHeldBodyRelease(t *testing.T) {
	readErr := make(chan error, 1)
	afterRelease := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held := &heldBody{body: r.Body}
		started := make(chan struct{})
		go func() { // the transport's write of the request
			buf := make([]byte, 5)
			if _, err := held.Read(buf); err != nil {
				readErr <- fmt.Errorf("first read: %w", err)
				return
			}
			close(started)
			_, err := held.Read(make([]byte, 100)) // blocks: the client sends no more
			readErr <- err
			_, err = held.Read(buf)
			afterRelease <- err
		}()
		<-started
		// Until the second read is under way (it holds the lock while it
		// waits on the client).
		for held.mu.TryLock() {
			held.mu.Unlock()
			runtime.Gosched()
		}
		held.release(w)
		w.WriteHeader(http.StatusBadGateway)
	}))
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// 100 bytes announced, 5 sent.
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nhello")
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("the blocked read returned no error")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("release did not wake the read blocked on the client")
	}
	if err := <-afterRelease; !errors.Is(err, http.ErrBodyReadAfterClose) {
		t.Fatalf("a read after release: %v, want ErrBodyReadAfterClose", err)
	}
}
