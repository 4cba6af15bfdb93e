package cli

import (
	"context"

	"github.com/spf13/cobra"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

var spaceKind = &kind[*torporv1.Space]{
	name:   "space",
	plural: "spaces",
	sample: "team-a",
	get: func(ctx context.Context, c *clients, req *torporv1.GetRequest) (*torporv1.Space, error) {
		return call(ctx, c.spaces.GetSpace, req)
	},
	list: func(ctx context.Context, c *clients, req *torporv1.ListRequest) ([]*torporv1.Space, string, error) {
		resp, err := call(ctx, c.spaces.ListSpaces, req)
		return resp.GetSpaces(), resp.GetNextPageToken(), err
	},
	delete: func(ctx context.Context, c *clients, req *torporv1.DeleteRequest) error {
		_, err := call(ctx, c.spaces.DeleteSpace, req)
		return err
	},
	deleteFlag: &deleteFlag{
		name:  "cascade",
		usage: "delete what the space holds first: its actors (running ones stopped without a snapshot), snapshot tags and templates",
		set:   func(req *torporv1.DeleteRequest) { req.Cascade = true },
	},
}

func newSpaceCommand(a *app) *cobra.Command {
	noun := spaceKind.nounCommand(a, "Manage spaces, the tenants actors and templates live in")
	noun.AddCommand(&cobra.Command{
		Use:     "create NAME",
		Example: "  torpor space create team-a",
		Short:   "Create a space",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			space, err := call(cmd.Context(), c.spaces.CreateSpace, &torporv1.CreateSpaceRequest{
				Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: args[0]}},
			})
			if err != nil {
				return err
			}
			return spaceKind.printChanged(cmd.OutOrStdout(), a.output, space, "created")
		},
	})
	return noun
}
