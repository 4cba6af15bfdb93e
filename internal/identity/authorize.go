package identity

import (
	"context"
	"errors"
	"fmt"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// ErrDenied wraps every refusal of AuthorizeWorkload with its reason. The
// reason is for the server's log: callers must hear one message whatever
// it was, so a refusal reveals nothing about other nodes' workers.
var ErrDenied = errors.New("not permitted to mint credentials for this workload")

// Records read the records a mint is decided on: a worker by (namespace,
// name) and an actor by (space, name), errdefs.ErrNotFound for none. Read
// the store itself (the Get of its collections, outside or inside a
// transaction), never a cache: an assignment committed before the call
// must be honoured on every replica (DESIGN invariant 4).
type Records struct {
	Worker func(ctx context.Context, namespace, name string) (*torporv1.Worker, error)
	Actor  func(ctx context.Context, space, name string) (*torporv1.Actor, error)
}

// WorkloadClaim is what a node says runs on one of its workers. The worker
// is keyed by (namespace, name) alone, as in the store: nothing the
// request lacks (such as a pool) is needed to find it.
type WorkloadClaim struct {
	WorkerNamespace, WorkerName, WorkerUID, ActorUID string
}

// AuthorizeWorkload grants callerNode credentials for the actor claim
// names when the store says all of: the worker exists on callerNode with
// the claimed uid; it hosts the actor with the claimed uid; that actor
// names this worker back (invariant 1); and the actor is not being
// deleted. Refusals wrap ErrDenied; other errors are the store's.
//
// The worker and the actor are read one after the other, not in one
// transaction: placements are written on both sides in one transaction,
// so when the worker read shows the actor, the actor showed the worker at
// that moment too; a grant means the placement was committed, and a
// placement changed in between shows up as a mismatch (a refusal).
func AuthorizeWorkload(ctx context.Context, records Records, callerNode string, claim WorkloadClaim) (Workload, error) {
	deny := func(format string, args ...any) (Workload, error) {
		return Workload{}, fmt.Errorf("%w: %s", ErrDenied, fmt.Sprintf(format, args...))
	}
	if callerNode == "" {
		return deny("no calling node")
	}
	w, err := records.Worker(ctx, claim.WorkerNamespace, claim.WorkerName)
	if errors.Is(err, errdefs.ErrNotFound) {
		return deny("worker does not exist")
	}
	if err != nil {
		return Workload{}, err
	}
	switch {
	case w.GetSpec().GetNode() != callerNode:
		return deny("worker is on node %q", w.GetSpec().GetNode())
	case w.GetMetadata().GetUid() != claim.WorkerUID:
		return deny("worker uid is %s", w.GetMetadata().GetUid())
	}
	hosted := w.GetStatus().GetActor()
	switch {
	case hosted.GetUid() == "":
		return deny("worker hosts no actor")
	case hosted.GetUid() != claim.ActorUID:
		return deny("worker hosts actor %s/%s (uid %s)", hosted.GetSpace(), hosted.GetName(), hosted.GetUid())
	}
	a, err := records.Actor(ctx, hosted.GetSpace(), hosted.GetName())
	if errors.Is(err, errdefs.ErrNotFound) {
		return deny("actor %s/%s the worker hosts does not exist", hosted.GetSpace(), hosted.GetName())
	}
	if err != nil {
		return Workload{}, err
	}
	placed := a.GetStatus().GetWorker()
	switch {
	case a.GetMetadata().GetUid() != claim.ActorUID:
		return deny("actor %s/%s now has uid %s", hosted.GetSpace(), hosted.GetName(), a.GetMetadata().GetUid())
	case placed.GetUid() != w.GetMetadata().GetUid() || placed.GetNamespace() != claim.WorkerNamespace || placed.GetName() != claim.WorkerName:
		return deny("actor %s/%s is placed on worker %s/%s (uid %s)", hosted.GetSpace(), hosted.GetName(), placed.GetNamespace(), placed.GetName(), placed.GetUid())
	case a.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_DELETING:
		return deny("actor %s/%s is being deleted", hosted.GetSpace(), hosted.GetName())
	}
	return Workload{Space: hosted.GetSpace(), Actor: hosted.GetName(), ActorUID: claim.ActorUID}, nil
}
