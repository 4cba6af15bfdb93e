package server

import (
	"context"
	"strings"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/validate"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// forkActor creates an actor from another's snapshot (CreateActorRequest
// with from). The caller's access is to the new actor's space, checked
// by the gate; a source in another space is reached only through a
// published tag, which the engine checks.
func (s *actorService) forkActor(ctx context.Context, m *torporv1.CreateActorRequest) (*connect.Response[torporv1.Actor], error) {
	a, from := m.GetActor(), m.GetFrom()
	meta := a.GetMetadata()
	if err := keyOf(meta.GetSpace(), meta.GetName(), true); err != nil {
		return nil, err
	}
	if err := validate.Labels("actor.metadata.labels", meta.GetLabels()); err != nil {
		return nil, err
	}
	if err := validate.Labels("actor.spec.workerSelector", a.GetSpec().GetWorkerSelector()); err != nil {
		return nil, err
	}
	switch {
	case (from.GetActor() == "") == (from.GetTag() == ""):
		return nil, invalidArgument("from", "name exactly one of actor and tag")
	case from.GetActor() != "":
		if err := validate.Name("from.actor", from.GetActor()); err != nil {
			return nil, err
		}
	default:
		space, tag, cross := strings.Cut(from.GetTag(), "/")
		if !cross {
			tag = space
		} else if err := validate.Name("from.tag", space); err != nil {
			return nil, err
		}
		if err := validate.Name("from.tag", tag); err != nil {
			return nil, err
		}
	}
	opts := workflow.ForkOptions{
		Actor: from.GetActor(), Tag: from.GetTag(), Template: a.GetSpec().GetTemplate(), Revision: a.GetSpec().GetTemplateRevision(),
		Selector: a.GetSpec().GetWorkerSelector(), Labels: meta.GetLabels(), AllowStateLoss: m.GetAllowStateLoss(),
	}
	if opts.Template != "" {
		if err := validate.Name("actor.spec.template", opts.Template); err != nil {
			return nil, err
		}
	}
	created, err := s.engine.Fork(ctx, meta.GetSpace(), meta.GetName(), opts)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(created), nil
}

func (s *actorService) RevertActor(ctx context.Context, req *connect.Request[torporv1.RevertActorRequest]) (*connect.Response[torporv1.Actor], error) {
	m := req.Msg
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return nil, err
	}
	a, err := s.engine.Revert(ctx, m.GetSpace(), m.GetName(), m.GetSnapshot())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(a), nil
}

func (s *snapshotService) TagSnapshot(ctx context.Context, req *connect.Request[torporv1.TagSnapshotRequest]) (*connect.Response[torporv1.SnapshotTag], error) {
	m := req.Msg
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return nil, err
	}
	if err := validate.Name("snapshot", m.GetSnapshot()); err != nil {
		return nil, err
	}
	if _, ok := torporv1.SnapshotTagScope_name[int32(m.GetScope())]; !ok {
		return nil, invalidArgument("scope", "unknown scope %d", m.GetScope())
	}
	t, err := s.engine.Tag(ctx, m.GetSpace(), m.GetName(), m.GetSnapshot(), m.GetScope())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(t), nil
}

func (s *snapshotService) ListSnapshotTags(ctx context.Context, req *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListSnapshotTagsResponse], error) {
	items, next, err := list(ctx, s.store.Tags(), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ListSnapshotTagsResponse{Tags: items, NextPageToken: next}), nil
}

func (s *snapshotService) UntagSnapshot(ctx context.Context, req *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	m := req.Msg
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return nil, err
	}
	if err := s.engine.Untag(ctx, m.GetSpace(), m.GetName(), m.GetUid(), m.GetVersion()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.DeleteResponse{}), nil
}
