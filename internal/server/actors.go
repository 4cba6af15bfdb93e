package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/egress"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
	"github.com/torpor-dev/torpor/internal/workflow"
)

type actorService struct {
	store    store.Store
	engine   *workflow.Engine
	agents   *nodeAgents
	sessions *sessions
	// relays owns the input relays of exec calls (ExecActor), which end
	// just after their call: a relay blocked on the client's next message
	// returns once the handler did and the stream closed.
	relays *sync.WaitGroup
	// objects: snapshot storage, where the logs of actors that do not
	// run are read.
	objects snapshot.ObjectStore
}

func (s *actorService) CreateActor(ctx context.Context, req *connect.Request[torporv1.CreateActorRequest]) (*connect.Response[torporv1.Actor], error) {
	a := req.Msg.GetActor()
	if a == nil {
		return nil, invalidArgument("actor", "required")
	}
	if req.Msg.GetFrom() != nil {
		return s.forkActor(ctx, req.Msg)
	}
	if err := validate.Actor(a); err != nil {
		return nil, err
	}
	if err := refuseSandboxSettings(a.GetSpec()); err != nil {
		return nil, err
	}
	policy, err := admitEgress(ctx, s.store, a.GetMetadata().GetSpace(), a.GetSpec().GetEgress(), "spec.egress")
	if err != nil {
		return nil, err
	}
	created, err := createSuspendedActor(ctx, s.store, userMeta(a.GetMetadata()), &torporv1.ActorSpec{
		Template: a.GetSpec().GetTemplate(), TemplateRevision: a.GetSpec().GetTemplateRevision(), WorkerSelector: a.GetSpec().GetWorkerSelector(),
	}, policy)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(created), nil
}

// createSuspendedActor creates an actor SUSPENDED, on the revision spec
// names of its template (0: the latest), in one transaction with the
// checks that its space exists, that revision may take new actors and
// that the actor's egress policy lies within the revision's.
func createSuspendedActor(ctx context.Context, st store.Store, meta *torporv1.ObjectMeta, spec *torporv1.ActorSpec, policy egress.Policy) (*torporv1.Actor, error) {
	var created *torporv1.Actor
	err := st.InTx(ctx, func(tx store.Tx) error {
		if err := requireSpace(ctx, tx, meta.GetSpace()); err != nil {
			return err
		}
		rev, err := requireRevision(ctx, tx, meta.GetSpace(), spec.GetTemplate(), spec.GetTemplateRevision())
		if err != nil {
			return err
		}
		onRevision := proto.CloneOf(spec)
		onRevision.TemplateRevision = rev.GetStatus().GetRevision()
		if onRevision.Egress, err = actorEgress(rev, policy); err != nil {
			return err
		}
		created, err = tx.Actors().Create(ctx, &torporv1.Actor{
			Metadata: meta,
			Spec:     onRevision,
			Status: &torporv1.ActorStatus{
				State:     torporv1.ActorState_ACTOR_STATE_SUSPENDED,
				StateTime: timestamppb.New(time.Now()),
			},
		})
		return err
	})
	return created, err
}

func (s *actorService) GetActor(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error) {
	a, err := get(ctx, s.store.Actors(), req.Msg, true)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(a), nil
}

func (s *actorService) ListActors(ctx context.Context, req *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListActorsResponse], error) {
	items, next, err := list(ctx, s.store.Actors(), req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ListActorsResponse{Actors: items, NextPageToken: next}), nil
}

// UpdateActor changes an actor's spec by field mask: the worker selector,
// and the template (a repoint, checked against the actor's snapshot).
func (s *actorService) UpdateActor(ctx context.Context, req *connect.Request[torporv1.UpdateActorRequest]) (*connect.Response[torporv1.Actor], error) {
	in := req.Msg.GetActor()
	meta := in.GetMetadata()
	if err := keyOf(meta.GetSpace(), meta.GetName(), true); err != nil {
		return nil, err
	}
	paths := req.Msg.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalidArgument("updateMask", "names no field to update")
	}
	u := workflow.SpecUpdate{Version: meta.GetVersion(), AllowStateLoss: req.Msg.GetAllowStateLoss()}
	for _, p := range paths {
		switch p {
		case "spec.worker_selector", "spec.workerSelector":
			sel := in.GetSpec().GetWorkerSelector()
			if err := validate.Labels("actor.spec.workerSelector", sel); err != nil {
				return nil, err
			}
			u.Selector = &sel
		case "spec.template":
			if err := validate.Name("actor.spec.template", in.GetSpec().GetTemplate()); err != nil {
				return nil, err
			}
			if err := validate.Revision("actor.spec.templateRevision", in.GetSpec().GetTemplateRevision()); err != nil {
				return nil, err
			}
			u.Template, u.Revision = in.GetSpec().GetTemplate(), in.GetSpec().GetTemplateRevision()
		case "spec.egress":
			policy, err := admitEgress(ctx, s.store, meta.GetSpace(), in.GetSpec().GetEgress(), "spec.egress")
			if err != nil {
				return nil, err
			}
			u.Egress = &policy
		default:
			return nil, invalidArgument("updateMask", "%q cannot be updated (updatable: spec.worker_selector, spec.template, spec.egress)", p)
		}
	}
	updated, err := s.engine.UpdateSpec(ctx, meta.GetSpace(), meta.GetName(), u)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(updated), nil
}

// DeleteActor removes an actor that holds no worker, with its snapshots;
// with force, a running one too (its workload stopped without a
// snapshot).
func (s *actorService) DeleteActor(ctx context.Context, req *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	m := req.Msg
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return nil, err
	}
	if m.GetUid() != "" || m.GetVersion() != 0 {
		a, err := s.store.Actors().Get(ctx, m.GetSpace(), m.GetName())
		if err != nil {
			return nil, err
		}
		if (m.GetUid() != "" && m.GetUid() != a.GetMetadata().GetUid()) || (m.GetVersion() != 0 && m.GetVersion() != a.GetMetadata().GetVersion()) {
			return nil, connect.NewError(connect.CodeAborted, fmt.Errorf("actor %s/%s does not match the given uid or version", m.GetSpace(), m.GetName()))
		}
	}
	if err := s.engine.Delete(ctx, m.GetSpace(), m.GetName(), workflow.DeleteOptions{Force: m.GetForce()}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.DeleteResponse{}), nil
}

func (s *actorService) ResumeActor(ctx context.Context, req *connect.Request[torporv1.ResumeActorRequest]) (*connect.Response[torporv1.Actor], error) {
	m := req.Msg
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return nil, err
	}
	a, err := s.engine.Resume(ctx, m.GetSpace(), m.GetName(), workflow.ResumeOptions{Boot: m.GetBoot(), Snapshot: m.GetSnapshot(), AllowStateLoss: m.GetAllowStateLoss(), Repeat: m.GetRepeat(), OnDemand: m.GetOnDemand()})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(a), nil
}

func (s *actorService) SuspendActor(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error) {
	return s.step(ctx, req.Msg, s.engine.Suspend)
}

func (s *actorService) PauseActor(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error) {
	return s.step(ctx, req.Msg, s.engine.Pause)
}

func (s *actorService) step(ctx context.Context, m *torporv1.GetRequest, fn func(ctx context.Context, space, name string) (*torporv1.Actor, error)) (*connect.Response[torporv1.Actor], error) {
	if err := keyOf(m.GetSpace(), m.GetName(), true); err != nil {
		return nil, err
	}
	a, err := fn(ctx, m.GetSpace(), m.GetName())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(a), nil
}

func (s *actorService) ListActorEvents(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.ListActorEventsResponse], error) {
	a, err := get(ctx, s.store.Actors(), req.Msg, true)
	if err != nil {
		return nil, err
	}
	events, err := s.store.Events(ctx, a.GetMetadata().GetUid(), 0)
	if err != nil {
		return nil, err
	}
	resp := &torporv1.ListActorEventsResponse{}
	for _, ev := range events {
		resp.Events = append(resp.Events, &torporv1.ActorEvent{
			Time: timestamppb.New(ev.Time), FromState: ev.FromState, ToState: ev.ToState, Reason: ev.Reason,
			OperationId: ev.OperationID, Worker: ev.Worker, DurationMs: ev.Duration.Milliseconds(),
		})
	}
	return connect.NewResponse(resp), nil
}

// requireRevision returns the number of revision rev (0: the latest) of
// template name, which a new actor may be created on: it exists and its
// golden build did not fail. One still building is accepted: the actor's
// first resume cold-boots until the golden snapshot is ready, and says so.
func requireRevision(ctx context.Context, tx store.Tx, space, name string, rev int64) (*torporv1.Template, error) {
	_, r, err := workflow.Revision(ctx, tx, space, name, rev)
	if isNotFound(err) {
		return nil, failedPrecondition("spec.template: %v", err)
	}
	if err != nil {
		return nil, err
	}
	if err := workflow.Usable(r); err != nil {
		return nil, err
	}
	return r, nil
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
