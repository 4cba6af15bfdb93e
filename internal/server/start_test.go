package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// TestStopLeavesNothingRunning: Stop of a running control plane ends
// everything Start began, the background loops, the certificate renewal and
// a step driver its caller stopped waiting for (in a call to a node that
// does not answer) included, before it closes the store. Before, the driver ran
// on, calling the node and reading the closed store.
func TestStopLeavesNothingRunning(t *testing.T) {
	before := goleak.IgnoreCurrent()
	dir := t.TempDir()
	r, err := Start(context.Background(), Options{
		Listen: "127.0.0.1:0", Store: "sqlite:" + filepath.Join(dir, "torpor.db"), Snapshots: filepath.Join(dir, "snapshots"),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			r.Stop()
		}
	}()
	ctx := context.Background()
	addNodeNobodyAnswers(t, r.Store, "n1")
	err = r.Store.InTx(ctx, func(tx store.Tx) error {
		_, _, err := workflow.ApplyTemplate(ctx, tx, &torporv1.ObjectMeta{Space: "default", Name: "counter"}, &torporv1.TemplateSpec{
			SandboxClass: "gvisor",
			Containers:   []*torporv1.Container{{Name: "main", Image: pinnedImage}},
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Store.Actors().Create(ctx, &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "c1"},
		Spec:     &torporv1.ActorSpec{Template: "counter", TemplateRevision: 1},
		Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED},
	}); err != nil {
		t.Fatal(err)
	}
	waiting, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := r.Server.Engine().Resume(waiting, "default", "c1", workflow.ResumeOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("resume on a node that does not answer: %v, want the caller to stop waiting", err)
	}

	stopped = true
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, before)
}

// addNodeNobodyAnswers registers node with two workers (one for the
// template's golden build, which the background work starts, one for an
// actor) at an address that takes connections and never answers: a call
// hangs in its TLS handshake (for 5 s, agentClient's bound).
func addNodeNobodyAnswers(t *testing.T, st store.Store, node string) {
	t.Helper()
	// Never accepted: the kernel's backlog takes the connections.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	addr := ln.Addr().String()
	ctx := context.Background()
	if _, err := st.Nodes().Create(ctx, &torporv1.Node{Metadata: &torporv1.ObjectMeta{Name: node}, Address: "https://" + addr, HeartbeatTime: timestamppb.Now(), SandboxClasses: []string{"gvisor"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := st.Workers().Create(ctx, &torporv1.Worker{
			Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: fmt.Sprintf("%s-w%d", node, i)},
			Spec:     &torporv1.WorkerSpec{Node: node, Ip: fmt.Sprintf("10.0.0.%d", i+2), Pool: "default", SandboxClass: "gvisor"},
			Status:   &torporv1.WorkerStatus{},
		}); err != nil {
			t.Fatal(err)
		}
	}
}
