package workflow

import (
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// reported is worker name of node as its agent reports it: no uid, no
// status.
func (e *env) reported(name string) *torporv1.Worker {
	e.t.Helper()
	w, err := e.store.Workers().Get(e.ctx, validate.WorkerNamespace, name)
	if err != nil {
		e.t.Fatal(err)
	}
	return &torporv1.Worker{Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: name}, Spec: proto.CloneOf(w.GetSpec())}
}

// A node registering again keeps its workers' uids and placements; a
// worker it no longer reports is removed and its actor crashed.
func TestRegisterNodeKeepsPlacementsAndRemovesUnreported(t *testing.T) {
	e := newEnv(t, 2, "n1")
	e.createActor("c1")
	running, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	busy := running.GetStatus().GetWorker().GetName()
	other := "n1-w0"
	if busy == other {
		other = "n1-w1"
	}
	before, err := e.store.Workers().Get(e.ctx, validate.WorkerNamespace, busy)
	if err != nil {
		t.Fatal(err)
	}
	node := &torporv1.Node{Metadata: &torporv1.ObjectMeta{Name: "n1"}, Address: "https://n1"}

	_, workers, err := e.engine.RegisterNode(e.ctx, node, []*torporv1.Worker{e.reported("n1-w0"), e.reported("n1-w1")})
	if err != nil {
		t.Fatal(err)
	}
	if len(workers) != 2 {
		t.Fatalf("registration answered %d workers, want 2", len(workers))
	}
	for _, w := range workers {
		if w.GetMetadata().GetName() != busy {
			continue
		}
		if w.GetMetadata().GetUid() != before.GetMetadata().GetUid() || w.GetStatus().GetActor().GetUid() != running.GetMetadata().GetUid() {
			t.Fatalf("worker %s registered again as %v, want uid %s hosting %s", busy, w, before.GetMetadata().GetUid(), running.GetMetadata().GetUid())
		}
	}
	wantState(t, e.actor("c1"), torporv1.ActorState_ACTOR_STATE_RUNNING)

	if _, _, err := e.engine.RegisterNode(e.ctx, node, []*torporv1.Worker{e.reported(other)}); err != nil {
		t.Fatal(err)
	}
	a := e.actor("c1")
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_CRASHED)
	if want := "worker " + busy + " disappeared from node n1"; !strings.Contains(a.GetStatus().GetCrashReason(), want) {
		t.Fatalf("crash reason %q, want it to say %q", a.GetStatus().GetCrashReason(), want)
	}
	if _, err := e.store.Workers().Get(e.ctx, validate.WorkerNamespace, busy); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unreported worker %s: %v, want it removed", busy, err)
	}
	e.checkPlacement()
}

// A node cannot take over another node's worker.
func TestRegisterNodeRefusesAnotherNodesWorker(t *testing.T) {
	e := newEnv(t, 1, "n1", "n2")
	taken := e.reported("n1-w0")
	taken.Spec.Node = "n2"
	_, _, err := e.engine.RegisterNode(e.ctx, &torporv1.Node{Metadata: &torporv1.ObjectMeta{Name: "n2"}, Address: "https://n2"}, []*torporv1.Worker{taken})
	if errdefs.Code(err) != connect.CodeFailedPrecondition {
		t.Fatalf("registering n1's worker for n2: %v, want FailedPrecondition", err)
	}
}

// A node that was lost is told to register again, and heartbeats once it
// did.
func TestHeartbeatOfLostNode(t *testing.T) {
	e := newEnv(t, 1, "n1")
	if _, err := e.engine.Heartbeat(e.ctx, "n9", HostMemory{}); errdefs.Code(err) != connect.CodeNotFound {
		t.Fatalf("heartbeat of a node never registered: %v, want NotFound", err)
	}
	if _, err := e.engine.Heartbeat(e.ctx, "n1", HostMemory{}); err != nil {
		t.Fatal(err)
	}
	n, err := e.store.Nodes().Get(e.ctx, "", "n1")
	if err != nil {
		t.Fatal(err)
	}
	n.HeartbeatTime = timestamppb.New(time.Now().Add(-2 * time.Minute))
	if _, err := e.store.Nodes().Update(e.ctx, n); err != nil {
		t.Fatal(err)
	}
	if _, err := e.engine.Heartbeat(e.ctx, "n1", HostMemory{}); errdefs.Code(err) != connect.CodeNotFound || !strings.Contains(err.Error(), "was lost") {
		t.Fatalf("heartbeat of a lost node: %v, want NotFound saying it was lost", err)
	}
	if _, _, err := e.engine.RegisterNode(e.ctx, n, []*torporv1.Worker{e.reported("n1-w0")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.engine.Heartbeat(e.ctx, "n1", HostMemory{}); err != nil {
		t.Fatalf("heartbeat after registering again: %v", err)
	}
}
