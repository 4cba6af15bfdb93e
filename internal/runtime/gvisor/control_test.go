package gvisor

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPauseResume: the calls the slot gate makes on a running sandbox's
// control socket, on real runsc: a paused sandbox answers nothing (its
// netstack still takes the connection), a resumed one goes on with its
// memory.
func TestPauseResume(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	slot := h.slots[0]
	if err := h.rt.Run(ctx, slot, h.workload(t)); err != nil {
		t.Fatal(err)
	}
	waitReady(t, slot.IP)
	if got := request(t, slot.IP); !strings.HasPrefix(got, "count=1 ") {
		t.Fatalf("first request: %q", got)
	}
	socket, err := h.rt.ControlSocket(slot)
	if err != nil {
		t.Fatal(err)
	}
	p := Pauser(socket)
	if err := p.Pause(ctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	short := &http.Client{Timeout: 300 * time.Millisecond}
	if resp, err := short.Get("http://" + net.JoinHostPort(slot.IP, strconv.Itoa(port)) + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatal("a paused sandbox answered")
	}
	if err := p.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	waitReady(t, slot.IP)
	if got := request(t, slot.IP); !strings.HasPrefix(got, "count=2 ") {
		t.Fatalf("after the resume: %q, want count=2 (memory kept)", got)
	}
}
