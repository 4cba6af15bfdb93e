package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func newTokenCommand(a *app) *cobra.Command {
	noun := &cobra.Command{
		Use:   "token",
		Short: "Make tokens: API tokens for spaces, join tokens for nodes (admin only)",
	}
	var (
		node   string
		spaces []string
		ttl    time.Duration
	)
	create := &cobra.Command{
		Use:   "create (--node NAME | --spaces A,B) [--ttl DURATION]",
		Short: "Create a node join token or an API token and print it",
		Long: `Create a token and print it; the server keeps only its hash, so this is the
only time it is shown.

  --node NAME     a join token for node NAME: it buys that node its first
                  certificate, once (torpor node --join-token ... --ca-fingerprint ...).
                  Default lifetime 1h.
  --spaces A,B    an API token for the templates, actors and snapshots of
                  spaces A and B (torpor --token ...). Default lifetime 24h.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &torporv1.CreateTokenRequest{}
			switch {
			case node != "" && len(spaces) > 0:
				return fmt.Errorf("--node and --spaces: a token is either a node's join token or an API token")
			case node != "":
				req.Purpose, req.Node = torporv1.TokenPurpose_TOKEN_PURPOSE_NODE_JOIN, node
			case len(spaces) > 0:
				req.Purpose, req.Spaces = torporv1.TokenPurpose_TOKEN_PURPOSE_API, spaces
			default:
				return fmt.Errorf("name --node NAME (a node join token) or --spaces A,B (an API token)")
			}
			if ttl < 0 {
				return fmt.Errorf("--ttl %s: must be positive", ttl)
			}
			if ttl > 0 {
				req.Ttl = durationpb.New(ttl)
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), c.identity.CreateToken, req)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if a.output != formatTable {
				return printMessages(w, a.output, []proto.Message{resp}, false)
			}
			fmt.Fprintf(w, "token:          %s\nexpires:        %s\n", resp.GetToken(), resp.GetExpireTime().AsTime().Format(time.RFC3339))
			if node == "" {
				fmt.Fprintf(w, "\nUse it for spaces %s: torpor --token %s ...\n", strings.Join(spaces, ", "), resp.GetToken())
				return nil
			}
			fmt.Fprintf(w, "ca-fingerprint: %s\n\nJoin the node (once; it keeps its certificate in its state directory):\n  torpor node --name %s --join-token %s --ca-fingerprint %s\n",
				resp.GetCaFingerprint(), node, resp.GetToken(), resp.GetCaFingerprint())
			return nil
		},
	}
	create.Flags().StringVar(&node, "node", "", "make a join token for this node")
	create.Flags().StringSliceVar(&spaces, "spaces", nil, "make an API token for these spaces (comma-separated)")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime (default 1h for a join token, 24h for an API token; at most 8760h)")
	noun.AddCommand(create)
	return noun
}
