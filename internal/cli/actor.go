package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

var actorKind = &kind[*torporv1.Actor]{
	name:   "actor",
	plural: "actors",
	spaced: true,
	columns: []column[*torporv1.Actor]{
		{"TEMPLATE", func(a *torporv1.Actor) string { return a.GetSpec().GetTemplate() }},
		{"STATE", func(a *torporv1.Actor) string { return enumName(a.GetStatus().GetState()) }},
		{"WORKER", func(a *torporv1.Actor) string { return a.GetStatus().GetWorker().GetName() }},
	},
	get: func(ctx context.Context, c *clients, req *torporv1.GetRequest) (*torporv1.Actor, error) {
		return call(ctx, c.actors.GetActor, req)
	},
	list: func(ctx context.Context, c *clients, req *torporv1.ListRequest) ([]*torporv1.Actor, string, error) {
		resp, err := call(ctx, c.actors.ListActors, req)
		return resp.GetActors(), resp.GetNextPageToken(), err
	},
	delete: func(ctx context.Context, c *clients, req *torporv1.DeleteRequest) error {
		_, err := call(ctx, c.actors.DeleteActor, req)
		return err
	},
}

func newActorCommand(a *app) *cobra.Command {
	noun := actorKind.nounCommand(a, "Manage actors")
	noun.AddCommand(
		newActorCreateCommand(a),
		newActorUpdateCommand(a),
		newActorResumeCommand(a),
		newActorCheckpointCommand(a, "suspend", "suspended", "Checkpoint an actor to snapshot storage and free its worker",
			func(c *clients) actorStep { return c.actors.SuspendActor }),
		newActorCheckpointCommand(a, "pause", "paused", "Checkpoint an actor on its node and free its worker (resumes there fastest)",
			func(c *clients) actorStep { return c.actors.PauseActor }),
		newActorEventsCommand(a),
	)
	return noun
}

func newActorCreateCommand(a *app) *cobra.Command {
	var spec torporv1.ActorSpec
	cmd := &cobra.Command{
		Use:   "create NAME --template TEMPLATE",
		Short: "Create an actor (it starts suspended and resumes on its first request)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			actor, err := call(cmd.Context(), c.actors.CreateActor, &torporv1.CreateActorRequest{Actor: &torporv1.Actor{
				Metadata: &torporv1.ObjectMeta{Space: a.space, Name: args[0]},
				Spec:     &spec,
			}})
			if err != nil {
				return err
			}
			return actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, "created")
		},
	}
	cmd.Flags().StringVar(&spec.Template, "template", "", "name of the template in the actor's space")
	cmd.Flags().StringToStringVar(&spec.WorkerSelector, "selector", nil, "labels a worker must carry to host the actor (k=v,...)")
	_ = cmd.MarkFlagRequired("template") // the flag exists: cannot fail
	return cmd
}

func newActorUpdateCommand(a *app) *cobra.Command {
	var spec torporv1.ActorSpec
	var allowStateLoss bool
	cmd := &cobra.Command{
		Use:   "update NAME [--selector k=v,...] [--template TEMPLATE [--allow-state-loss]]",
		Short: "Change an actor's worker selector or template",
		Long: "Change an actor's worker selector or template. Only the fields given are sent.\n" +
			"A template can be changed only while the actor is suspended or crashed, and only\n" +
			"to one compatible with its latest snapshot. The next resume discards the actor's\n" +
			"process memory and keeps its durable volumes; when the snapshot holds no durable\n" +
			"data that loses all state, which --allow-state-loss must accept.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var mask fieldmaskpb.FieldMask
			for _, f := range []struct{ flag, path string }{{"selector", "spec.worker_selector"}, {"template", "spec.template"}} {
				if cmd.Flags().Changed(f.flag) {
					mask.Paths = append(mask.Paths, f.path)
				}
			}
			if len(mask.Paths) == 0 {
				return errors.New("nothing to update: give --selector or --template")
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			actor, err := call(cmd.Context(), c.actors.UpdateActor, &torporv1.UpdateActorRequest{
				Actor: &torporv1.Actor{
					Metadata: &torporv1.ObjectMeta{Space: a.space, Name: args[0]},
					Spec:     &spec,
				},
				UpdateMask:     &mask,
				AllowStateLoss: allowStateLoss,
			})
			if err != nil {
				return err
			}
			return actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, "updated")
		},
	}
	cmd.Flags().StringToStringVar(&spec.WorkerSelector, "selector", nil, "labels a worker must carry (k=v,...); an empty value clears them")
	cmd.Flags().StringVar(&spec.Template, "template", "", "name of a compatible template to move the actor to")
	cmd.Flags().BoolVar(&allowStateLoss, "allow-state-loss", false, "accept a repoint that discards all state (the snapshot holds no durable data)")
	return cmd
}

func newActorResumeCommand(a *app) *cobra.Command {
	var req torporv1.ResumeActorRequest
	cmd := &cobra.Command{
		Use:   "resume NAME",
		Short: "Bring an actor to RUNNING on a free worker (normally the router does this on demand)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			req.Space, req.Name = a.space, args[0]
			actor, err := call(cmd.Context(), c.actors.ResumeActor, &req)
			if err != nil {
				return err
			}
			return actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, "resumed")
		},
	}
	cmd.Flags().BoolVar(&req.Boot, "boot", false, "cold-boot an actor that has no state instead of restoring the golden snapshot")
	cmd.Flags().StringVar(&req.Snapshot, "snapshot", "", "restore this kept snapshot instead of the latest")
	return cmd
}

// actorStep is an RPC that moves one actor, named by a GetRequest.
type actorStep func(context.Context, *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error)

func newActorCheckpointCommand(a *app, verb, past, short string, rpc func(*clients) actorStep) *cobra.Command {
	return &cobra.Command{
		Use:   verb + " NAME",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			actor, err := call(cmd.Context(), rpc(c), &torporv1.GetRequest{Space: a.space, Name: args[0]})
			if err != nil {
				return err
			}
			return actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, past)
		},
	}
}

func newActorEventsCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "events NAME",
		Short: "Show an actor's state history",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), c.actors.ListActorEvents, &torporv1.GetRequest{Space: a.space, Name: args[0]})
			if err != nil {
				return err
			}
			if a.output != formatTable {
				return printMessages(cmd.OutOrStdout(), a.output, []proto.Message{resp}, false)
			}
			if len(resp.GetEvents()) == 0 {
				_, err := fmt.Fprintln(cmd.ErrOrStderr(), "No events found.")
				return err
			}
			rows := make([][]string, len(resp.GetEvents()))
			for i, e := range resp.GetEvents() {
				var took string
				if e.GetDurationMs() > 0 {
					took = (time.Duration(e.GetDurationMs()) * time.Millisecond).String()
				}
				rows[i] = []string{
					e.GetTime().AsTime().Local().Format(time.DateTime),
					enumName(e.GetFromState()),
					enumName(e.GetToState()),
					e.GetWorker(),
					took,
					e.GetReason(),
				}
			}
			return printTable(cmd.OutOrStdout(), []string{"TIME", "FROM", "TO", "WORKER", "TOOK", "REASON"}, rows)
		},
	}
}
