package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime/fake"
)

func TestReadiness(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	slot, _ := n.net.Slot(ctx, n.worker(0), 0)

	// A workload that answers 503 a few times, then 200.
	ln, err := net.Listen("tcp", slot.IP+":0")
	if err != nil {
		t.Fatal(err)
	}
	var probes atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ready" {
			http.NotFound(w, r)
			return
		}
		if probes.Add(1) <= 3 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := int32(ln.Addr().(*net.TCPAddr).Port)

	withProbe := func(path string, port, timeout int32) *torporv1.Workload {
		w := n.workload("a1")
		w.Template = appTemplate(t)
		w.Template.Containers[0].ReadinessProbe = &torporv1.Probe{HttpGet: &torporv1.HTTPGetAction{Path: path, Port: port}, TimeoutSeconds: timeout}
		return w
	}
	if _, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("a1", "op-1", n.worker(0)), Workload: withProbe("/ready", port, 5)})); err != nil {
		t.Fatal(err)
	}
	if got := probes.Load(); got != 4 {
		t.Fatalf("probe answered %d times, want 4 (3 failures, then ready)", got)
	}
	if err := n.terminate(ctx, "a1", "op-t", 0); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	_, err = n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("a1", "op-2", n.worker(0)), Workload: withProbe("/missing", port, 1)}))
	wantCode(t, err, connect.CodeDeadlineExceeded)
	if took := time.Since(began); took < time.Second {
		t.Fatalf("readiness gave up after %v, before its 1s timeout", took)
	}
	for _, want := range []string{"actor s/actor-a1", "readiness probe GET http://" + net.JoinHostPort(slot.IP, fmt.Sprint(port)) + "/missing", "within 1s", "404"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if st := n.stats(t, 0); st.GetRunning() || st.GetActorUid() != "" {
		t.Fatalf("stats %v after a readiness timeout, want the workload terminated", st)
	}
	if _, err := os.Stat(n.volumeDir("a1")); !os.IsNotExist(err) {
		t.Fatalf("volumes left after a readiness timeout: %v", err)
	}
}

// A start waits for every container's probe, whatever its kind: a TCP
// port that accepts connections only later, and a command that fails a
// few times before it exits 0.
func TestReadinessOfEveryContainer(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	slot, _ := n.net.Slot(ctx, n.worker(0), 0)
	// A port that is free now; the "workload" listens on it later.
	ln, err := net.Listen("tcp", slot.IP+":0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	port := int32(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	// Set before the port listens: a probe that passes comes after it.
	var listened atomic.Bool
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		// Not before the exec probe has run: the start waits for both.
		for !slices.ContainsFunc(n.rt.Calls(), func(c fake.Call) bool { return c.Method == "Exec" }) {
			time.Sleep(time.Millisecond)
		}
		listened.Store(true)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { ln.Close() })
	}()
	for range 3 {
		n.rt.FailNext("Exec", errors.New("exit status 1: not yet"))
	}
	w := n.workload("a1")
	w.Template = appTemplate(t)
	w.Template.Containers[0].ReadinessProbe = &torporv1.Probe{TcpSocket: &torporv1.TCPSocketAction{Port: port}, TimeoutSeconds: 30}
	side := proto.Clone(w.Template.Containers[0]).(*torporv1.Container)
	side.Name = "side"
	side.ReadinessProbe = &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/app", "ping"}}, TimeoutSeconds: 30}
	w.Template.Containers = append(w.Template.Containers, side)
	if _, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("a1", "op-1", n.worker(0)), Workload: w})); err != nil {
		t.Fatal(err)
	}
	if !listened.Load() {
		t.Fatal("the start returned before the TCP probe's port listened")
	}
	<-listening
	var execs []fake.Call
	for _, c := range n.rt.Calls() {
		if c.Method == "Exec" {
			execs = append(execs, c)
		}
	}
	if len(execs) != 4 {
		t.Fatalf("exec probe ran %d times, want 4 (3 failures, then ready)", len(execs))
	}
	for _, c := range execs {
		if c.Container != "side" || !slices.Equal(c.Cmd, []string{"/app", "ping"}) {
			t.Fatalf("exec probe ran %q in container %q, want /app ping in side", c.Cmd, c.Container)
		}
	}
	if err := n.terminate(ctx, "a1", "op-t", 0); err != nil {
		t.Fatal(err)
	}

	// A probe that never passes fails the start, naming its container.
	w.Template.Containers[1].ReadinessProbe = &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/app", "ping"}}, TimeoutSeconds: 1, PeriodSeconds: 1}
	// More failures than attempts fit in the timeout.
	for range 5 {
		n.rt.FailNext("Exec", errors.New("exit status 1: not ready"))
	}
	_, err = n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("a1", "op-2", n.worker(0)), Workload: w}))
	wantCode(t, err, connect.CodeDeadlineExceeded)
	for _, want := range []string{"container side", `readiness probe exec ["/app" "ping"]`, "not ready"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}
