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
	var created boundsFlags
	create := &cobra.Command{
		Use:     "create NAME",
		Example: "  torpor space create team-a\n  torpor space create team-b --egress-host '*.example.com' --egress-cidr 203.0.113.0/24",
		Short:   "Create a space",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			space, err := call(cmd.Context(), c.spaces.CreateSpace, &torporv1.CreateSpaceRequest{
				Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: args[0]}, Spec: created.spec()},
			})
			if err != nil {
				return err
			}
			return spaceKind.printChanged(cmd.OutOrStdout(), a.output, space, "created")
		},
	}
	created.add(create)
	var updated boundsFlags
	var version int64
	update := &cobra.Command{
		Use:     "update NAME",
		Example: "  torpor space update team-a --egress-host api.example.com,'*.pypi.org'\n  torpor space update team-a --egress-allow-any\n  torpor space update team-a   # back to the default bounds: deny, and host names only",
		Short:   "Replace a space's egress bounds (administrators only)",
		Long: "Replace what the egress policies of a space's templates and actors may allow when a space token applies them.\n" +
			"The flags given are the new bounds whole; with none, the default: DENY and allowlists of host names only.\n" +
			"Templates and actors stored already are not checked again; the bounds hold from their next apply.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			space, err := call(cmd.Context(), c.spaces.UpdateSpace, &torporv1.UpdateSpaceRequest{
				Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: args[0], Version: version}, Spec: updated.spec()},
			})
			if err != nil {
				return err
			}
			return spaceKind.printChanged(cmd.OutOrStdout(), a.output, space, "updated")
		},
	}
	updated.add(update)
	update.Flags().Int64Var(&version, "version", 0, "update only if the space is at this version (metadata.version)")
	noun.AddCommand(create, update)
	return noun
}
