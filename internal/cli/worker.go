package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/validate"
)

var workerKind = &kind[*torporv1.Worker]{
	name:   "worker",
	plural: "workers",
	sample: "node-a-w0",
	spaced: true,
	// Node agents register their workers in one namespace.
	defaultSpace: validate.WorkerNamespace,
	columns: []column[*torporv1.Worker]{
		{"NODE", func(w *torporv1.Worker) string { return w.GetSpec().GetNode() }},
		{"IP", func(w *torporv1.Worker) string { return w.GetSpec().GetIp() }},
		{"POOL", func(w *torporv1.Worker) string { return w.GetSpec().GetPool() }},
		{"ACTOR", func(w *torporv1.Worker) string {
			if actor := w.GetStatus().GetActor(); actor.GetName() != "" {
				return actor.GetSpace() + "/" + actor.GetName()
			}
			return ""
		}},
		// How long the actor has been idle, as the idle policy and
		// eviction see it; "serving N" while requests are in flight.
		{"IDLE", func(w *torporv1.Worker) string {
			st := w.GetStatus()
			switch {
			case st.GetActorInFlight() > 0:
				return fmt.Sprintf("serving %d", st.GetActorInFlight())
			case st.GetActorLastActive() != nil:
				return formatAge(time.Since(st.GetActorLastActive().AsTime()))
			}
			return ""
		}},
	},
	get: func(ctx context.Context, c *clients, req *torporv1.GetRequest) (*torporv1.Worker, error) {
		return call(ctx, c.workers.GetWorker, req)
	},
	list: func(ctx context.Context, c *clients, req *torporv1.ListRequest) ([]*torporv1.Worker, string, error) {
		resp, err := call(ctx, c.workers.ListWorkers, req)
		return resp.GetWorkers(), resp.GetNextPageToken(), err
	},
	delete: func(ctx context.Context, c *clients, req *torporv1.DeleteRequest) error {
		_, err := call(ctx, c.workers.DeleteWorker, req)
		return err
	},
}

func newWorkerCommand(a *app) *cobra.Command {
	noun := workerKind.nounCommand(a, "Manage workers, the warm sandbox slots actors run in (--space is the worker's namespace)")
	noun.AddCommand(newWorkerCreateCommand(a))
	return noun
}

// Node agents register their workers themselves; create is for workers
// managed by hand or by another system.
func newWorkerCreateCommand(a *app) *cobra.Command {
	var (
		spec   torporv1.WorkerSpec
		labels map[string]string
	)
	cmd := &cobra.Command{
		Use:     "create NAME --node NODE --ip IP",
		Example: "  torpor worker create node-a-w9 --node node-a --ip 10.213.0.11",
		Short:   "Register a worker",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			worker, err := call(cmd.Context(), c.workers.CreateWorker, &torporv1.CreateWorkerRequest{Worker: &torporv1.Worker{
				Metadata: &torporv1.ObjectMeta{Space: workerKind.space(a), Name: args[0], Labels: labels},
				Spec:     &spec,
			}})
			if err != nil {
				return err
			}
			return workerKind.printChanged(cmd.OutOrStdout(), a.output, worker, "created")
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&spec.Node, "node", "", "node hosting the worker")
	flags.StringVar(&spec.Ip, "ip", "", "the worker's IP address")
	flags.StringVar(&spec.Pool, "pool", "", "worker pool")
	flags.StringVar(&spec.SandboxClass, "class", "gvisor", "sandbox class")
	flags.StringToStringVar(&labels, "labels", nil, "labels actor selectors match (k=v,...)")
	return cmd
}
