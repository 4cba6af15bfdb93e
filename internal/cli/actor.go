package cli

import (
	"context"
	"errors"

	"github.com/spf13/cobra"
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
	noun.AddCommand(newActorCreateCommand(a), newActorUpdateCommand(a))
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
	cmd := &cobra.Command{
		Use:   "update NAME [--selector k=v,...] [--template TEMPLATE]",
		Short: "Change an actor's worker selector or template",
		Long: "Change an actor's worker selector or template. Only the fields given are sent.\n" +
			"A template can be changed only while the actor is suspended or crashed, and only\n" +
			"to one compatible with its latest snapshot.",
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
				UpdateMask: &mask,
			})
			if err != nil {
				return err
			}
			return actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, "updated")
		},
	}
	cmd.Flags().StringToStringVar(&spec.WorkerSelector, "selector", nil, "labels a worker must carry (k=v,...); an empty value clears them")
	cmd.Flags().StringVar(&spec.Template, "template", "", "name of a compatible template to move the actor to")
	return cmd
}
