package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/retry"
	"github.com/torpor-dev/torpor/internal/slotgate"
	"github.com/torpor-dev/torpor/internal/validate"
)

// A request to a running actor is routed by the router's table alone: the
// control plane streams the placements (PlacementService.WatchPlacements)
// and the router's own resumes and reads add to them. Nothing in the table
// has to be fresh for safety: the router reaches a workload only through
// its node's slot gate, naming the actor's uid, and the gate admits the
// connection only while the worker hosts that actor (internal/slotgate).
// A stale placement is refused before anything is sent, and the request
// asks the control plane as it did before there was a table.

// placementWatcher is the part of the control plane that streams
// placements.
type placementWatcher interface {
	WatchPlacements(context.Context, *connect.Request[torporv1.WatchPlacementsRequest]) (*connect.ServerStreamForClient[torporv1.PlacementBatch], error)
}

// errNoGate: the actor's node does not admit routed connections (a node
// agent older than the router).
var errNoGate = errors.New("the worker has no slot gate")

// actorPlacement is where a RUNNING actor is reached, as a is.
func actorPlacement(key ActorKey, a *torporv1.Actor) (placement, error) {
	st := a.GetStatus()
	if st.GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING || st.GetWorker().GetName() == "" {
		return placement{}, fmt.Errorf("actor %s is %s on no worker after resume", key, st.GetState())
	}
	at, err := placementOf(a.GetMetadata().GetUid(), a.GetMetadata().GetVersion(), st.GetWorker(), validate.WorkloadPort(st.GetCurrentTemplateSpec()))
	if err != nil {
		return placement{}, fmt.Errorf("actor %s: %w", key, err)
	}
	return at, nil
}

func placementOf(uid string, version int64, worker *torporv1.WorkerRef, port int32) (placement, error) {
	if worker.GetGate() == "" {
		return placement{}, fmt.Errorf("worker %s of node %s: %w", worker.GetName(), worker.GetNode(), errNoGate)
	}
	return placement{version: version, target: slotgate.Target{
		Gate: worker.GetGate(), Worker: worker.GetName(), ActorUID: uid, Port: int(port),
	}}, nil
}

// dialActor connects to port of key's running workload through its node's
// slot gate, resuming the actor first if needed; the connection reaches
// that actor only, and ends when its worker stops hosting it. A refused
// (stale) placement is resolved again from the control plane, a gate that
// does not answer is waited for (gatepark.go); a port nothing listens on
// is errPortClosed. For tunnels (tunnel.go).
func (r *Router) dialActor(ctx context.Context, key ActorKey, port int, resumed *time.Duration) (net.Conn, error) {
	var park gatePark
	refusals := 0
	for fresh := false; ; fresh = true {
		before := *resumed
		at, _, err := r.resolveActor(ctx, key, fresh, resumed)
		if err != nil {
			return nil, err
		}
		t := at.target
		t.Port = port
		conn, err := slotgate.Dial(ctx, &r.dialer, t)
		switch {
		case err == nil:
			return conn, nil
		case gateDownErr(err):
			if !r.waitGate(ctx, &park) {
				return nil, fmt.Errorf("actor %s at %s: %w for %s: %w", key, t, errGateDown, r.cfg.ParkTimeout, err)
			}
		case errors.Is(err, slotgate.ErrStale) && refusals < maxRefusals:
			refusals++
		case fresh || *resumed != before:
			return nil, fmt.Errorf("actor %s at %s: %w: %w", key, t, errPortClosed, err)
		}
		r.actors.forget(key, at)
	}
}

// watchBackoff paces reconnecting a placement watch: the table keeps
// serving meanwhile, every entry still checked by the gates.
var watchBackoff = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// watchSilence: a watch that sends nothing for this long (the control
// plane sends its version every 5 s) is taken for dead and started again.
const watchSilence = 15 * time.Second

// watch keeps the table's placements current until ctx ends, resuming
// the stream from the last version it applied after each disconnect.
func (r *Router) watch(ctx context.Context) {
	var version int64
	b := watchBackoff.Start()
	for {
		applied, err := r.watchOnce(ctx, &version)
		if ctx.Err() != nil {
			return
		}
		if applied {
			b = watchBackoff.Start()
		}
		r.metrics.watchRestarts.Inc()
		r.log.Warn("placement watch ended; resuming", "version", version, "err", err)
		if !b.Wait(ctx) {
			return
		}
	}
}

// watchOnce follows one stream from *version, applying each batch and
// moving *version on; applied says whether any batch came.
func (r *Router) watchOnce(ctx context.Context, version *int64) (applied bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	silence := time.AfterFunc(watchSilence, cancel)
	defer silence.Stop()
	stream, err := r.watcher.WatchPlacements(ctx, connect.NewRequest(&torporv1.WatchPlacementsRequest{FromVersion: *version}))
	if err != nil {
		return false, err
	}
	defer stream.Close()
	for stream.Receive() {
		silence.Reset(watchSilence)
		r.apply(stream.Msg())
		*version = stream.Msg().GetVersion()
		applied = true
	}
	if err := stream.Err(); err != nil {
		return applied, err
	}
	return applied, errors.New("the control plane ended the stream")
}

// apply brings the table to a batch of placements.
func (r *Router) apply(b *torporv1.PlacementBatch) {
	if b.GetReplace() {
		r.actors.reset()
		r.sandboxes.reset()
	}
	for _, p := range b.GetPlacements() {
		key := ActorKey{Space: p.GetSpace(), Name: p.GetName()}
		switch p.GetState() {
		case torporv1.ActorState_ACTOR_STATE_UNSPECIFIED:
			r.actors.gone(p.GetActorUid())
			r.sandboxes.gone(p.GetActorUid())
		case torporv1.ActorState_ACTOR_STATE_RUNNING:
			at, err := placementOf(p.GetActorUid(), p.GetActorVersion(), p.GetWorker(), p.GetPort())
			if err != nil {
				r.log.Warn("placement not used", "actor", key.String(), "err", err)
				continue
			}
			r.actors.learn(key, at)
		default:
			r.actors.stopped(key, p.GetActorUid(), p.GetActorVersion())
		}
	}
	if b.GetSynced() {
		r.actors.synced()
	}
}
