package router

// E2B sandboxes: the E2B SDK reaches port P of sandbox ID at
// P-ID.<domain>, or at the router's own address with the headers
// E2b-Sandbox-Id and E2b-Sandbox-Port (address.go). A sandbox is an actor
// whose name is its ID, in whichever space made it; the ID names no space,
// so only the control plane's sandbox index (PlacementService.LookupSandbox)
// says which actor it is: an actor merely named like a sandbox ID, in any
// space, is never taken for it. The router keeps what the index said
// (the actor's key and uid, and whether traffic may resume it) and routes
// by its placement table as for any actor, checking the uid, so a stale
// entry costs a lookup, never a wrong destination.
//
// What a request finds: a RUNNING sandbox is proxied to the port asked
// for through the node's slot gate (any port). One that is not running
// (paused, suspended, being stopped) answers 502 and is not resumed,
// unless it was created with autoResume: then the request resumes it as
// requests resume actors. An unknown, killed or deleted sandbox (or one in
// a space this router does not serve) answers 502 naming the sandbox.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
)

// sandboxAPI is the part of the control plane that resolves sandbox IDs.
type sandboxAPI interface {
	LookupSandbox(context.Context, *connect.Request[torporv1.LookupSandboxRequest]) (*connect.Response[torporv1.LookupSandboxResponse], error)
}

// errSandboxNotFound: the sandbox index has no such ID for this router.
var errSandboxNotFound = errors.New("no such sandbox")

// sandboxStopped: the sandbox is not running and traffic does not resume
// it (it was created without autoResume).
type sandboxStopped struct{ state torporv1.ActorState }

// Error says the state as E2B does: every state but running (and being
// resumed) is paused there.
func (e *sandboxStopped) Error() string {
	if e.state == torporv1.ActorState_ACTOR_STATE_RESUMING {
		return "being resumed"
	}
	return "paused, " + enum.Name(e.state)
}

// sandboxRef is what the sandbox index said of one ID.
type sandboxRef struct {
	id  string
	key ActorKey
	uid string
	// autoResume: a request finding the sandbox stopped resumes it.
	autoResume bool
	// state is the sandbox's state when the index answered this request;
	// UNSPECIFIED when the reference came from the cache.
	state torporv1.ActorState
}

// sandboxTable caches the index's answers by sandbox ID. An ID names one
// actor for the actor's life, so an entry goes only when the placement
// watch reports the actor deleted or resets, or when a request finds the
// uid it names gone.
type sandboxTable struct {
	mu sync.Mutex
	m  map[string]sandboxRef
}

func newSandboxTable() *sandboxTable { return &sandboxTable{m: map[string]sandboxRef{}} }

func (t *sandboxTable) get(id string) (sandboxRef, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ref, ok := t.m[id]
	return ref, ok
}

func (t *sandboxTable) put(ref sandboxRef) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ref.state = torporv1.ActorState_ACTOR_STATE_UNSPECIFIED
	t.m[ref.id] = ref
}

func (t *sandboxTable) drop(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, id)
}

// gone drops the entry of a deleted actor.
func (t *sandboxTable) gone(uid string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, ref := range t.m {
		if ref.uid == uid {
			delete(t.m, id)
		}
	}
}

func (t *sandboxTable) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.m)
}

// sandbox returns what the index says of id, from the cache when it has
// it.
func (r *Router) sandbox(ctx context.Context, id string) (sandboxRef, error) {
	if ref, ok := r.sandboxes.get(id); ok {
		return ref, nil
	}
	return r.lookupSandbox(ctx, id)
}

// lookupSandbox asks the index about id and caches the answer. Like a
// resume, it asks again while the control plane cannot answer, up to
// ParkTimeout.
func (r *Router) lookupSandbox(ctx context.Context, id string) (sandboxRef, error) {
	var resp *connect.Response[torporv1.LookupSandboxResponse]
	err := r.askParked(ctx, "look up sandbox "+id, func(ctx context.Context) (err error) {
		r.metrics.requestCalls.WithLabelValues(callLookupSandbox).Inc()
		resp, err = r.sandboxAPI.LookupSandbox(ctx, connect.NewRequest(&torporv1.LookupSandboxRequest{SandboxId: id}))
		return err
	})
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
		r.sandboxes.drop(id)
		return sandboxRef{}, fmt.Errorf("sandbox %s: %w: %w", id, errSandboxNotFound, err)
	case errors.Is(err, errControlPlaneDown), errors.Is(err, context.Canceled):
		return sandboxRef{}, err
	case err != nil:
		return sandboxRef{}, fmt.Errorf("look up sandbox %s: %w", id, err)
	}
	m := resp.Msg
	ref := sandboxRef{
		id: id, key: ActorKey{Space: m.GetSpace(), Name: m.GetName()}, uid: m.GetActorUid(),
		autoResume: m.GetSandbox().GetAutoResume(), state: m.GetState(),
	}
	r.sandboxes.put(ref)
	return ref, nil
}

// resolveSandbox is resolveActor for a sandbox: where its workload runs,
// by the table when it places the sandbox's actor (under the uid the index
// gave), else by asking the index and then the actor, resuming it only if
// it was created with autoResume. *ref is brought up to date with the
// index.
func (r *Router) resolveSandbox(ctx context.Context, ref *sandboxRef, fresh bool, resumed *time.Duration) (placement, *torporv1.Actor, error) {
	if !fresh {
		if at, ok := r.actors.placement(ref.key); ok && at.target.ActorUID == ref.uid {
			return at, nil, nil
		}
	}
	if ref.state == torporv1.ActorState_ACTOR_STATE_UNSPECIFIED {
		looked, err := r.lookupSandbox(ctx, ref.id)
		if err != nil {
			return placement{}, nil, err
		}
		*ref = looked
	}
	state := ref.state
	// The state is used once: a second attempt of this request asks again.
	ref.state = torporv1.ActorState_ACTOR_STATE_UNSPECIFIED
	if state == torporv1.ActorState_ACTOR_STATE_RUNNING {
		// Running but not (yet) in the table: a read, which never wakes
		// it, says where.
		var resp *connect.Response[torporv1.Actor]
		err := r.askParked(ctx, "sandbox "+ref.id, func(ctx context.Context) (err error) {
			r.metrics.requestCalls.WithLabelValues(callGet).Inc()
			resp, err = r.api.GetActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: ref.key.Space, Name: ref.key.Name}))
			return err
		})
		switch {
		case connect.CodeOf(err) == connect.CodeNotFound:
			return placement{}, nil, r.sandboxGone(ref, err)
		case err != nil:
			return placement{}, nil, fmt.Errorf("sandbox %s: %w", ref.id, err)
		}
		a := resp.Msg
		if a.GetMetadata().GetUid() != ref.uid {
			return placement{}, nil, r.sandboxGone(ref, errors.New("its actor was replaced"))
		}
		state = a.GetStatus().GetState()
		if state == torporv1.ActorState_ACTOR_STATE_RUNNING {
			at, err := r.learn(ref.key, a)
			return at, nil, err
		}
	}
	if state == torporv1.ActorState_ACTOR_STATE_DELETING {
		// Killed, for E2B.
		return placement{}, nil, r.sandboxGone(ref, errDeleting)
	}
	if !ref.autoResume {
		return placement{}, nil, fmt.Errorf("sandbox %s: %w", ref.id, &sandboxStopped{state: state})
	}
	at, a, err := r.resumeFor(ctx, ref.key, resumed)
	if err != nil {
		if connect.CodeOf(err) == connect.CodeNotFound {
			return placement{}, nil, r.sandboxGone(ref, err)
		}
		return placement{}, nil, err
	}
	if a.GetMetadata().GetUid() != ref.uid {
		// The sandbox was deleted and an actor of its name made since
		// the index answered: not this request's destination.
		return placement{}, nil, r.sandboxGone(ref, errors.New("its actor was replaced"))
	}
	return at, a, nil
}

// sandboxGone forgets a sandbox whose actor is no longer the one the
// index named.
func (r *Router) sandboxGone(ref *sandboxRef, err error) error {
	r.sandboxes.drop(ref.id)
	return fmt.Errorf("sandbox %s (actor %s): %w: %w", ref.id, ref.uid, errSandboxNotFound, err)
}
