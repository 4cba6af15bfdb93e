package httpserve

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// A stream that ends when its server drains lets the shutdown finish
// cleanly; without Draining, Shutdown would give up on it and fail.
func TestLongStreamsEndWhenTheServerDrains(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush() //nolint:errcheck // the test reads the status
		close(entered)
		<-Draining(r.Context())
	})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, ln, h, nil) }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-entered
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if Draining(context.Background()) != nil {
		t.Error("Draining outside a server is not nil")
	}
}

// A request still in flight at the end of the grace period is cut, and
// the server ends without an error; a new connection is refused as soon
// as the drain begins.
func TestGraceEndClosesWhatRemains(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush() //nolint:errcheck // the test reads the status
		close(entered)
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeGrace(ctx, ln, h, nil, 300*time.Millisecond) }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-entered
	cancel()
	start := time.Now()
	for {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			break
		}
		conn.Close()
		if time.Since(start) > 5*time.Second {
			t.Fatal("the listener still accepts after the drain began")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Error("the request in flight past the grace period ended cleanly, want it cut")
	}
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Errorf("cut after %s, want the grace period", waited)
	}
}
