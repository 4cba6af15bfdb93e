package server

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
	"github.com/torpor-dev/torpor/internal/workflow"
)

type spaceService struct {
	store  store.Store
	engine *workflow.Engine
}

func (s *spaceService) CreateSpace(ctx context.Context, req *connect.Request[torporv1.CreateSpaceRequest]) (*connect.Response[torporv1.Space], error) {
	sp := req.Msg.GetSpace()
	if sp == nil {
		return nil, invalidArgument("space", "required")
	}
	if err := validate.Space(sp); err != nil {
		return nil, err
	}
	spec, err := spaceSpec(sp.GetSpec())
	if err != nil {
		return nil, err
	}
	created, err := s.store.Spaces().Create(ctx, &torporv1.Space{Metadata: userMeta(sp.GetMetadata()), Spec: spec})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(created), nil
}

func (s *spaceService) GetSpace(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Space], error) {
	sp, err := get(ctx, s.store.Spaces(), req.Msg, false)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(sp), nil
}

// ListSpaces lists the spaces; a caller limited to some sees those only.
func (s *spaceService) ListSpaces(ctx context.Context, req *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListSpacesResponse], error) {
	if visible, ok := visibleSpaces(ctx); ok && visible != nil {
		var items []*torporv1.Space
		for _, name := range visible {
			sp, err := s.store.Spaces().Get(ctx, "", name)
			if isNotFound(err) {
				continue
			}
			if err != nil {
				return nil, err
			}
			items = append(items, sp)
		}
		return connect.NewResponse(&torporv1.ListSpacesResponse{Spaces: items}), nil
	}
	items, next, err := list(ctx, s.store.Spaces(), &torporv1.ListRequest{PageSize: req.Msg.GetPageSize(), PageToken: req.Msg.GetPageToken()})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ListSpacesResponse{Spaces: items, NextPageToken: next}), nil
}

// DeleteSpace removes an empty space; a space still holding templates,
// actors or snapshot tags is refused so nothing is orphaned, unless the
// request cascades: what it holds is deleted first.
func (s *spaceService) DeleteSpace(ctx context.Context, req *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	name := req.Msg.GetName()
	if err := keyOf("", name, false); err != nil {
		return nil, err
	}
	if req.Msg.GetCascade() {
		if _, err := s.store.Spaces().Get(ctx, "", name); err != nil {
			return nil, err
		}
		if err := s.engine.EmptySpace(ctx, name); err != nil {
			return nil, err
		}
	}
	err := s.store.InTx(ctx, func(tx store.Tx) error {
		if _, err := tx.Spaces().Get(ctx, "", name); err != nil {
			return err
		}
		actors, _, err := tx.Actors().List(ctx, store.ListOptions{Space: name, PageSize: 1})
		if err != nil {
			return err
		}
		templates, _, err := tx.Templates().List(ctx, store.ListOptions{Space: name, PageSize: 1})
		if err != nil {
			return err
		}
		if len(actors)+len(templates) > 0 {
			return failedPrecondition("space %q is not empty: delete its actors and templates first, or delete it with cascade", name)
		}
		// A tag outlives its actor, and keeps its snapshot.
		tags, _, err := tx.Tags().List(ctx, store.ListOptions{Space: name, PageSize: 1})
		if err != nil {
			return err
		}
		if len(tags) > 0 {
			return failedPrecondition("space %q still has snapshot tags (%s): untag them first", name, tags[0].GetMetadata().GetName())
		}
		return tx.Spaces().Delete(ctx, "", name, req.Msg.GetUid(), req.Msg.GetVersion())
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.DeleteResponse{}), nil
}

// userMeta keeps only what a client may set; uid, version and times are
// the store's.
func userMeta(m *torporv1.ObjectMeta) *torporv1.ObjectMeta {
	return &torporv1.ObjectMeta{Name: m.GetName(), Space: m.GetSpace(), Labels: m.GetLabels()}
}

// requireSpace answers FailedPrecondition when a record names a space that
// does not exist.
func requireSpace(ctx context.Context, tx store.Tx, space string) error {
	if _, err := tx.Spaces().Get(ctx, "", space); err != nil {
		if isNotFound(err) {
			return failedPrecondition("space %q does not exist", space)
		}
		return err
	}
	return nil
}

// UpdateSpace replaces a space's spec (administrators only: the access
// rules give the SpaceService to them), conditional on metadata.version
// when it is not zero. New egress bounds hold for templates and actors
// applied from then on; what is stored already is not re-checked.
func (s *spaceService) UpdateSpace(ctx context.Context, req *connect.Request[torporv1.UpdateSpaceRequest]) (*connect.Response[torporv1.Space], error) {
	in := req.Msg.GetSpace()
	name := in.GetMetadata().GetName()
	if err := keyOf("", name, false); err != nil {
		return nil, err
	}
	spec, err := spaceSpec(in.GetSpec())
	if err != nil {
		return nil, err
	}
	var updated *torporv1.Space
	err = s.store.InTx(ctx, func(tx store.Tx) error {
		sp, err := tx.Spaces().Get(ctx, "", name)
		if err != nil {
			return err
		}
		if v := in.GetMetadata().GetVersion(); v != 0 && v != sp.GetMetadata().GetVersion() {
			return connect.NewError(connect.CodeAborted, fmt.Errorf("space %s is at version %d, not %d: re-read and retry", name, sp.GetMetadata().GetVersion(), v))
		}
		sp.Spec = spec
		updated, err = tx.Spaces().Update(ctx, sp)
		return err
	})
	if errors.Is(err, store.ErrConflict) {
		return nil, connect.NewError(connect.CodeAborted, fmt.Errorf("space %s changed during the update: retry: %w", name, err))
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(updated), nil
}

// spaceSpec checks a space's spec and returns what is stored of it.
func spaceSpec(spec *torporv1.SpaceSpec) (*torporv1.SpaceSpec, error) {
	if _, err := egress.ParseBounds(spec.GetEgressBounds(), "spec.egressBounds"); err != nil {
		return nil, err
	}
	return &torporv1.SpaceSpec{EgressBounds: spec.GetEgressBounds()}, nil
}
