package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
)

func newClientCommand(a *app) *cobra.Command {
	noun := &cobra.Command{
		Use:     "client",
		Example: "  torpor client list\n  torpor client delete edge-router",
		Short:   "List and delete the API clients that joined with a certificate (admin only)",
	}
	list := identityList(a, "List API clients: routers, users and admins with certificates", "  torpor client list",
		func(c torporv1connect.IdentityServiceClient) listRPC[torporv1.ListClientsRequest, torporv1.ListClientsResponse] {
			return c.ListClients
		},
		[]string{"NAME", "ROLE", "SPACES", "AGE"},
		func(resp *torporv1.ListClientsResponse, now time.Time) [][]string {
			rows := make([][]string, 0, len(resp.GetClients()))
			for _, cl := range resp.GetClients() {
				spaces := strings.Join(cl.GetSpaces(), ",")
				if spaces == "" {
					spaces = "(all)" // admins, and routers that name none
				}
				rows = append(rows, []string{cl.GetName(), strings.ToLower(enumName(cl.GetRole())), spaces, age(cl.GetCreateTime(), now)})
			}
			return rows
		})
	del := &cobra.Command{
		Use:     "delete NAME",
		Example: "  torpor client delete edge-router",
		Short:   "Revoke an API client: its certificates stop working with its next call",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			if _, err := call(cmd.Context(), c.identity.DeleteClient, &torporv1.DeleteClientRequest{Name: args[0]}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "client %s deleted\n", args[0])
			return nil
		},
	}
	noun.AddCommand(list, del)
	return noun
}

type listRPC[Req, Resp any] = func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)

// identityList is a `list` verb over one IdentityService call: a table of
// headers and rows, or the whole response with -o json|yaml.
func identityList[Req, Resp any](a *app, short, example string, rpc func(torporv1connect.IdentityServiceClient) listRPC[Req, Resp],
	headers []string, rows func(*Resp, time.Time) [][]string) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Example: example,
		Short:   short,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), rpc(c.identity), new(Req))
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if a.output != formatTable {
				return printMessages(w, a.output, []proto.Message{any(resp).(proto.Message)}, false)
			}
			return printTable(w, headers, rows(resp, time.Now()))
		},
	}
}
