package workflow

import (
	"context"
	"fmt"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// MaxEgressSamples bounds the samples of one ReportEgressDenied: each is
// one event in the actor's history, so a report cannot write more than
// this many. A report with more is refused (the node agent sends at most
// this many; a node that sends more is not one this control plane knows).
const MaxEgressSamples = 5

// EgressDeniedReason starts the reason of the events a refused egress
// connection (or name) writes in the actor's history.
const EgressDeniedReason = "EgressDenied"

// ReportEgressDenied records, in the history of actor actorUID, the
// sampled refusals of the workload operation opID started on worker of
// node: one event each, naming protocol, destination and port (the name,
// for "dns"), and the count of refusals since the node's last report. A
// report of a workload the actor no longer runs there is ignored.
func (e *Engine) ReportEgressDenied(ctx context.Context, node, worker, actorUID, opID string, count int64, samples []*torporv1.EgressDenial) error {
	return e.store.InTx(ctx, func(tx store.Tx) error {
		a, err := e.reportedWorkload(ctx, tx, node, worker, actorUID, opID)
		if a == nil || err != nil {
			return err
		}
		state := a.GetStatus().GetState()
		for _, d := range samples {
			err := tx.AppendEvent(ctx, store.Event{
				ActorUID: actorUID, Time: d.GetTime().AsTime(), FromState: state, ToState: state,
				Reason: egressDeniedReason(d, count), OperationID: opID, Worker: e.opts.WorkerNamespace + "/" + worker,
			})
			if err != nil {
				return fmt.Errorf("actor %s: record an egress refusal: %w", actorKey(a), err)
			}
		}
		return nil
	})
}

// egressDeniedReason is the event's reason for refusal d, one of count.
func egressDeniedReason(d *torporv1.EgressDenial, count int64) string {
	what := fmt.Sprintf("%s to %s port %d", d.GetProtocol(), d.GetDestination(), d.GetPort())
	switch d.GetProtocol() {
	case "dns":
		what = "name " + d.GetDestination()
	case "icmp":
		what = "icmp to " + d.GetDestination()
	}
	return fmt.Sprintf("%s: %s refused by the egress policy (%d refused since the last report)", EgressDeniedReason, what, count)
}
