package server

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
	"github.com/torpor-dev/torpor/internal/workflow"
)

type templateService struct {
	store  store.Store
	engine *workflow.Engine
	// created is called after a revision is stored or sent back to PENDING
	// (its golden build starts).
	created func()
	images  *image.Policy
}

// CreateTemplate applies a template: a new one, a new revision of an
// existing one whose spec changed, or nothing when the spec is the latest
// revision's. Revisions are immutable, so actors and snapshots can rely on
// the revision they name never changing.
func (s *templateService) CreateTemplate(ctx context.Context, req *connect.Request[torporv1.CreateTemplateRequest]) (*connect.Response[torporv1.Template], error) {
	t := req.Msg.GetTemplate()
	if t == nil {
		return nil, invalidArgument("template", "required")
	}
	meta := userMeta(t.GetMetadata())
	// The policy first: its refusal names the rule, where the spec's
	// size limit would name only the spec.
	policy, err := admitEgress(ctx, s.store, meta.GetSpace(), t.GetSpec().GetEgress(), "spec.egress")
	if err != nil {
		return nil, err
	}
	if err := s.admit(ctx, t); err != nil {
		return nil, err
	}
	spec := proto.Clone(t.GetSpec()).(*torporv1.TemplateSpec)
	validate.ApplyTemplateDefaults(spec)
	var stored *torporv1.Template
	var result workflow.ApplyResult
	err = s.store.InTx(ctx, func(tx store.Tx) error {
		if err := requireSpace(ctx, tx, meta.GetSpace()); err != nil {
			return err
		}
		var err error
		if spec.Egress, err = templateEgress(ctx, tx, meta, policy); err != nil {
			return err
		}
		stored, result, err = workflow.ApplyTemplate(ctx, tx, meta, spec)
		return err
	})
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrAlreadyExists) {
		return nil, connect.NewError(connect.CodeAborted, fmt.Errorf("template %s/%s was applied concurrently: retry: %w", meta.GetSpace(), meta.GetName(), err))
	}
	if err != nil {
		return nil, err
	}
	if result != workflow.ApplyUnchanged {
		s.created()
	}
	return connect.NewResponse(stored), nil
}

// revision reads the revision a request names: "NAME" (the latest) or
// "NAME@REV".
func (s *templateService) revision(ctx context.Context, space, ref string) (head, rev *torporv1.Template, err error) {
	name, num, err := templateRef(space, ref)
	if err != nil {
		return nil, nil, err
	}
	head, rev, err = workflow.Revision(ctx, s.store, space, name, num)
	return head, rev, err
}

func templateRef(space, ref string) (name string, rev int64, err error) {
	if err := validate.Name("space", space); err != nil {
		return "", 0, err
	}
	name, rev, err = validate.TemplateRef("name", ref)
	return name, rev, err
}

func (s *templateService) GetTemplate(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Template], error) {
	head, rev, err := s.revision(ctx, req.Msg.GetSpace(), req.Msg.GetName())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(workflow.TemplateView(head, rev)), nil
}

// ListTemplates shows each template's latest revision.
func (s *templateService) ListTemplates(ctx context.Context, req *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListTemplatesResponse], error) {
	heads, next, err := list(ctx, s.store.Templates(), req.Msg)
	if err != nil {
		return nil, err
	}
	resp := &torporv1.ListTemplatesResponse{NextPageToken: next}
	for _, head := range heads {
		m := head.GetMetadata()
		rev, err := s.store.Revisions().Get(ctx, m.GetSpace(), validate.RevisionName(m.GetName(), head.GetStatus().GetLatestRevision()))
		if err != nil {
			return nil, err
		}
		resp.Templates = append(resp.Templates, workflow.TemplateView(head, rev))
	}
	return connect.NewResponse(resp), nil
}

// DeleteTemplate deletes a template with all its revisions, or one older
// revision, unless actors or their snapshots still use them.
func (s *templateService) DeleteTemplate(ctx context.Context, req *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	m := req.Msg
	name, rev, err := templateRef(m.GetSpace(), m.GetName())
	if err != nil {
		return nil, err
	}
	if err := s.engine.DeleteTemplate(ctx, m.GetSpace(), name, rev, m.GetUid(), m.GetVersion()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.DeleteResponse{}), nil
}

// ListTemplateRevisions lists a template's revisions, oldest first, with
// the number of actors on each.
func (s *templateService) ListTemplateRevisions(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.ListTemplateRevisionsResponse], error) {
	m := req.Msg
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return nil, err
	}
	resp := &torporv1.ListTemplateRevisionsResponse{}
	err := s.store.InTx(ctx, func(tx store.Tx) error {
		resp.Revisions = nil
		head, err := tx.Templates().Get(ctx, m.GetSpace(), m.GetName())
		if err != nil {
			return err
		}
		for rev := int64(1); rev <= head.GetStatus().GetLatestRevision(); rev++ {
			r, err := tx.Revisions().Get(ctx, m.GetSpace(), validate.RevisionName(m.GetName(), rev))
			if isNotFound(err) {
				continue // deleted
			}
			if err != nil {
				return err
			}
			use, err := workflow.Use(ctx, tx, r)
			if err != nil {
				return err
			}
			resp.Revisions = append(resp.Revisions, &torporv1.TemplateRevision{Template: workflow.TemplateView(head, r), Actors: int64(len(use.Actors))})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// RebuildTemplate builds the golden snapshot of a FAILED revision again.
func (s *templateService) RebuildTemplate(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Template], error) {
	name, rev, err := templateRef(req.Msg.GetSpace(), req.Msg.GetName())
	if err != nil {
		return nil, err
	}
	t, err := s.engine.RebuildTemplate(ctx, req.Msg.GetSpace(), name, rev)
	if err != nil {
		return nil, err
	}
	s.created()
	return connect.NewResponse(t), nil
}

// RolloutTemplate moves the actors of older revisions to the latest.
func (s *templateService) RolloutTemplate(ctx context.Context, req *connect.Request[torporv1.RolloutTemplateRequest]) (*connect.Response[torporv1.RolloutTemplateResponse], error) {
	m := req.Msg
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return nil, err
	}
	target, results, err := s.engine.Rollout(ctx, m.GetSpace(), m.GetName(), m.GetAllowStateLoss())
	if err != nil {
		return nil, err
	}
	resp := &torporv1.RolloutTemplateResponse{Template: target}
	for _, r := range results {
		resp.Results = append(resp.Results, &torporv1.RolloutResult{Actor: r.Actor, FromRevision: r.FromRevision, Moved: r.Moved, Message: r.Message})
	}
	return connect.NewResponse(resp), nil
}
