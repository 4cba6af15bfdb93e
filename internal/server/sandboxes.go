package server

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// LookupSandbox resolves an E2B sandbox ID for a router. The ID is looked
// up in the actors' unique "sandbox" index (the names of actors made
// through the E2B-compatible API), never among other actors' names, so an
// actor a tenant names like another tenant's sandbox cannot capture its
// traffic. A sandbox in a space the router does not serve is NotFound,
// like one that does not exist.
func (s *placementService) LookupSandbox(ctx context.Context, req *connect.Request[torporv1.LookupSandboxRequest]) (*connect.Response[torporv1.LookupSandboxResponse], error) {
	spaces, ok := visibleSpaces(ctx)
	if !ok {
		return nil, connect.NewError(connect.CodeInternal, errors.New("sandbox lookup: the caller was not checked"))
	}
	id := req.Msg.GetSandboxId()
	if err := validate.SandboxID("sandboxId", id); err != nil {
		return nil, err
	}
	a, err := findSandbox(ctx, s.store, id)
	if err != nil {
		return nil, err
	}
	if spaces != nil && !slices.Contains(spaces, a.GetMetadata().GetSpace()) {
		return nil, fmt.Errorf("sandbox %s: %w", id, store.ErrNotFound)
	}
	return connect.NewResponse(&torporv1.LookupSandboxResponse{
		Space:    a.GetMetadata().GetSpace(),
		Name:     a.GetMetadata().GetName(),
		ActorUid: a.GetMetadata().GetUid(),
		State:    a.GetStatus().GetState(),
		Sandbox:  a.GetSpec().GetSandbox(),
	}), nil
}

// refuseSandboxSettings refuses, naming the field, the spec fields only
// an E2B sandbox's creation sets, rather than dropping them: CreateActor
// does not take them.
func refuseSandboxSettings(spec *torporv1.ActorSpec) error {
	for _, f := range []struct {
		path string
		set  bool
	}{
		{"actor.spec.env", len(spec.GetEnv()) > 0},
		{"actor.spec.envdAccessToken", spec.GetEnvdAccessToken() != ""},
		{"actor.spec.sandbox", spec.GetSandbox() != nil},
	} {
		if f.set {
			return invalidArgument(f.path, "is set only for E2B sandboxes, which CreateActor does not make; leave it unset")
		}
	}
	return nil
}

// findSandbox returns the actor of sandbox id, in whichever space it is;
// NotFound when no E2B sandbox has that ID.
func findSandbox(ctx context.Context, st store.Tx, id string) (*torporv1.Actor, error) {
	found, _, err := st.Actors().List(ctx, store.ListOptions{Filter: store.Filter{"sandbox": id}, PageSize: 1})
	if err != nil {
		return nil, fmt.Errorf("look up sandbox %s: %w", id, err)
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("sandbox %s: %w", id, store.ErrNotFound)
	}
	return found[0], nil
}
