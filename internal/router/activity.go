package router

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// syncAfter: a request for an actor the control plane has known idle
// for longer (and not serving a request from this router) is reported
// before the router asks where the actor runs; others ride the next
// batch. An idle stop or eviction reads the activity again after its
// claim and needs the actor idle for its template's minimum (2 s by
// default): an actor the control plane saw active within syncAfter, whose
// in-flight request reaches it with the next batch (ReportInterval), is
// not stopped under that request as long as a report takes less than the
// rest of that minimum (workflow/idle.go, stopIdle).
const syncAfter = 500 * time.Millisecond

// reportTimeout bounds one report call; a report that fails is sent again
// with the next batch.
const reportTimeout = 5 * time.Second

// syncReport tells the control plane of a request for key before the
// request goes on. A failure is left to the next batch: the request's
// own calls meet the same control plane and answer for it.
func (r *Router) syncReport(ctx context.Context, key ActorKey) {
	now := time.Now()
	r.actors.mu.Lock()
	e := r.actors.m[key]
	a := activity{key: key, lastActive: now, inflight: e.inflight}
	r.actors.mu.Unlock()
	r.metrics.requestCalls.WithLabelValues(callReport).Inc()
	if err := r.sendReport(ctx, []activity{a}); err != nil {
		r.log.Debug("report activity before the request", "actor", key.String(), "err", err)
		return
	}
	r.actors.markReported([]activity{a}, now)
}

// reportBatch sends what the control plane has not heard yet.
func (r *Router) reportBatch(ctx context.Context) {
	batch := r.actors.unreported()
	if len(batch) == 0 {
		r.actors.markReported(nil, time.Now())
		return
	}
	if err := r.sendReport(ctx, batch); err != nil {
		r.log.Warn("report activity", "actors", len(batch), "err", err)
		return
	}
	r.actors.markReported(batch, time.Now())
}

func (r *Router) sendReport(ctx context.Context, batch []activity) error {
	ctx, cancel := context.WithTimeout(ctx, reportTimeout)
	defer cancel()
	req := &torporv1.ReportActivityRequest{Reporter: r.cfg.Name}
	for _, a := range batch {
		req.Actors = append(req.Actors, &torporv1.ActorActivity{
			Space: a.key.Space, Name: a.key.Name, LastActive: timestamppb.New(a.lastActive), InFlight: int32(a.inflight),
		})
	}
	_, err := r.api.ReportActivity(ctx, connect.NewRequest(req))
	result := "ok"
	if err != nil {
		result = "error"
		err = fmt.Errorf("report the activity of %d actors as %s: %w", len(batch), r.cfg.Name, err)
	}
	r.metrics.reports.WithLabelValues(result).Inc()
	return err
}

// Run keeps the router's placements current (the placement watch) and
// reports the actors' activity to the control plane every ReportInterval
// until ctx is done, then once more. The control plane applies the idle
// policies and evictions by it.
func (r *Router) Run(ctx context.Context) error {
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		r.watch(ctx)
	}()
	defer func() { <-watched }()
	tick := time.NewTicker(r.cfg.ReportInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			r.reportBatch(context.WithoutCancel(ctx))
			return nil
		case <-tick.C:
		}
		r.reportBatch(ctx)
	}
}
