package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func newClientCommand(a *app) *cobra.Command {
	noun := &cobra.Command{
		Use:   "client",
		Short: "List and delete the API clients that joined with a certificate (admin only)",
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List API clients: routers, users and admins with certificates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), c.identity.ListClients, &torporv1.ListClientsRequest{})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if a.output != formatTable {
				return printMessages(w, a.output, []proto.Message{resp}, false)
			}
			now := time.Now()
			rows := make([][]string, 0, len(resp.GetClients()))
			for _, cl := range resp.GetClients() {
				spaces := strings.Join(cl.GetSpaces(), ",")
				if spaces == "" {
					spaces = "(all)" // admins, and routers that name none
				}
				rows = append(rows, []string{cl.GetName(), strings.ToLower(enumName(cl.GetRole())), spaces, age(cl.GetCreateTime(), now)})
			}
			return printTable(w, []string{"NAME", "ROLE", "SPACES", "AGE"}, rows)
		},
	}
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Revoke an API client: its certificates stop working with its next call",
		Args:  cobra.ExactArgs(1),
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
