package server

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

type templateService struct {
	store store.Store
	// created is called after a new template is stored (its golden build
	// starts).
	created func()
}

// CreateTemplate stores a new template. Templates are immutable: a second
// create with an identical spec returns the stored one, a different spec is
// refused, so actors and snapshots can rely on a template never changing.
func (s *templateService) CreateTemplate(ctx context.Context, req *connect.Request[torporv1.CreateTemplateRequest]) (*connect.Response[torporv1.Template], error) {
	t := req.Msg.GetTemplate()
	if t == nil {
		return nil, invalidArgument("template", "required")
	}
	if err := validate.Template(t, image.IsPinned); err != nil {
		return nil, apiError(err)
	}
	if err := validate.Commands(ctx, t, image.Config); err != nil {
		return nil, apiError(err)
	}
	spec := proto.Clone(t.GetSpec()).(*torporv1.TemplateSpec)
	validate.ApplyTemplateDefaults(spec)
	meta := userMeta(t.GetMetadata())
	var stored *torporv1.Template
	err := s.store.InTx(ctx, func(tx store.Tx) error {
		if err := requireSpace(ctx, tx, meta.GetSpace()); err != nil {
			return err
		}
		existing, err := tx.Templates().Get(ctx, meta.GetSpace(), meta.GetName())
		switch {
		case err == nil:
			if !proto.Equal(existing.GetSpec(), spec) {
				return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("template %s/%s exists with a different spec; templates are immutable: apply it under a new name", meta.GetSpace(), meta.GetName()))
			}
			stored = existing
			return nil
		case !isNotFound(err):
			return err
		}
		stored, err = tx.Templates().Create(ctx, &torporv1.Template{
			Metadata: meta,
			Spec:     spec,
			Status:   &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING},
		})
		return err
	})
	if err != nil {
		return nil, apiError(err)
	}
	s.created()
	return connect.NewResponse(stored), nil
}

func (s *templateService) GetTemplate(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Template], error) {
	t, err := get(ctx, s.store.Templates(), req.Msg, true)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(t), nil
}

func (s *templateService) ListTemplates(ctx context.Context, req *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListTemplatesResponse], error) {
	items, next, err := list(ctx, s.store.Templates(), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ListTemplatesResponse{Templates: items, NextPageToken: next}), nil
}

// DeleteTemplate removes a template. Actors that still name it keep their
// snapshots, which carry the template spec they were built on.
func (s *templateService) DeleteTemplate(ctx context.Context, req *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	return del(ctx, s.store.Templates(), req.Msg, true)
}

func (s *templateService) ListTemplateRevisions(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.ListTemplateRevisionsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("not yet"))
}

func (s *templateService) RebuildTemplate(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Template], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("not yet"))
}

func (s *templateService) RolloutTemplate(ctx context.Context, req *connect.Request[torporv1.RolloutTemplateRequest]) (*connect.Response[torporv1.RolloutTemplateResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("not yet"))
}
