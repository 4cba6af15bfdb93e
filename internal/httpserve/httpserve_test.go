package httpserve

import (
	"context"
	"net"
	"net/http"
	"testing"
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
