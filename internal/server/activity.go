package server

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// maxActivityBatch bounds one report: a router reports four times a
// second the actors it served since, which keeps a busy router far below
// this.
const maxActivityBatch = 10000

// ReportActivity stores a router's batch of activity in one write, apart
// from the actor records (their versions guard workflow steps). A time in
// the future (a router's clock ahead of ours) counts as now.
func (s *actorService) ReportActivity(ctx context.Context, req *connect.Request[torporv1.ReportActivityRequest]) (*connect.Response[torporv1.ReportActivityResponse], error) {
	m := req.Msg
	if err := validate.Name("reporter", m.GetReporter()); err != nil {
		return nil, err
	}
	if len(m.GetActors()) > maxActivityBatch {
		return nil, invalidArgument("actors", "%d actors in one report, at most %d", len(m.GetActors()), maxActivityBatch)
	}
	now := time.Now()
	reports := make([]store.Activity, 0, len(m.GetActors()))
	for i, a := range m.GetActors() {
		if err := keyOf(a.GetSpace(), a.GetName(), true); err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("actors[%d]: %w", i, err))
		}
		if a.GetLastActive() == nil || a.GetInFlight() < 0 {
			return nil, invalidArgument(fmt.Sprintf("actors[%d]", i), "needs lastActive and a non-negative inFlight")
		}
		last := a.GetLastActive().AsTime()
		if last.After(now) {
			last = now
		}
		reports = append(reports, store.Activity{Space: a.GetSpace(), Name: a.GetName(), Reporter: m.GetReporter(), LastActive: last, InFlight: int(a.GetInFlight())})
	}
	if err := s.store.RecordActivity(ctx, reports); err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ReportActivityResponse{}), nil
}

// withActivity fills the output-only activity fields of workers that
// host a RUNNING actor: its idle time is what the idle policy and
// eviction go by.
func withActivity(ctx context.Context, st store.Store, engine *workflow.Engine, workers []*torporv1.Worker) error {
	var running []*torporv1.Actor
	for _, w := range workers {
		ref := w.GetStatus().GetActor()
		if ref.GetUid() == "" {
			continue
		}
		a, err := st.Actors().Get(ctx, ref.GetSpace(), ref.GetName())
		if isNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		if a.GetMetadata().GetUid() == ref.GetUid() && a.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING {
			running = append(running, a)
		}
	}
	if len(running) == 0 {
		return nil
	}
	acts, err := engine.ActivityOf(ctx, running)
	if err != nil {
		return err
	}
	for _, w := range workers {
		if act, ok := acts[w.GetStatus().GetActor().GetUid()]; ok {
			w.Status.ActorLastActive = timestamppb.New(act.LastActive)
			w.Status.ActorInFlight = int32(act.InFlight)
		}
	}
	return nil
}
