package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
)

func newTokenCommand(a *app) *cobra.Command {
	noun := &cobra.Command{
		Use:     "token",
		Example: "  torpor token create --node node-b\n  torpor token list",
		Short:   "Make, list and revoke tokens: join tokens for nodes and clients, API tokens and E2B keys for spaces (admin only)",
	}
	noun.AddCommand(newTokenCreateCommand(a), newTokenListCommand(a), newTokenRevokeCommand(a))
	return noun
}

// clientRoles are the --role values.
var clientRoles = map[string]torporv1.ClientRole{
	"admin":  torporv1.ClientRole_CLIENT_ROLE_ADMIN,
	"router": torporv1.ClientRole_CLIENT_ROLE_ROUTER,
	"user":   torporv1.ClientRole_CLIENT_ROLE_USER,
}

func newTokenCreateCommand(a *app) *cobra.Command {
	var (
		node, client, role string
		spaces             []string
		ttl                time.Duration
		e2b                bool
	)
	create := &cobra.Command{
		Use:     "create (--node NAME | --client NAME --role ROLE [--spaces A,B] | --spaces A,B | --spaces A --e2b) [--ttl DURATION]",
		Example: "  torpor token create --node node-b\n  torpor token create --client edge --role router\n  torpor token create --spaces team-a --ttl 24h\n  torpor token create --spaces team-a --e2b",
		Short:   "Create a join token, an API token or an E2B key and print it",
		Long: `Create a token and print it; the server keeps only its hash, so this is the
only time it is shown.

  --node NAME     a join token for node NAME: it buys that node its first
                  certificate, once (torpor node --join-token ... --ca-fingerprint ...).
  --client NAME   a join token for API client NAME with --role:
                    router  get, resume, suspend and pause actors of --spaces
                            (of every space without --spaces): for torpor router
                    user    templates, actors and snapshots of --spaces
                    admin   everything the admin token may do
                  The client gets a certificate once (torpor router, or torpor
                  login for the CLI) and renews it; torpor client delete revokes it.
  --spaces A,B    alone: an API token for the templates, actors and snapshots of
                  spaces A and B (torpor --token ...).
  --spaces A --e2b
                  an E2B API key (e2b_...) for the sandboxes of space A, for the
                  E2B SDK (E2B_API_KEY); it is an API token of space A too.

Join tokens last 1h by default, API tokens 24h, E2B keys 365 days.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &torporv1.CreateTokenRequest{Spaces: spaces}
			if e2b && (node != "" || client != "") {
				return fmt.Errorf("--e2b: an E2B key is an API key for one space, not a join token (leave out --node and --client)")
			}
			switch {
			case node != "" && client != "":
				return fmt.Errorf("--node and --client: a join token is for one member")
			case node != "":
				if len(spaces) > 0 || role != "" {
					return fmt.Errorf("--node: a node join token takes no --spaces or --role")
				}
				req.Purpose, req.Name = torporv1.TokenPurpose_TOKEN_PURPOSE_NODE_JOIN, node
			case client != "":
				r, ok := clientRoles[role]
				if !ok {
					return fmt.Errorf("--role %q: want router, user or admin", role)
				}
				req.Purpose, req.Name, req.Role = torporv1.TokenPurpose_TOKEN_PURPOSE_CLIENT_JOIN, client, r
			case role != "":
				return fmt.Errorf("--role goes with --client NAME")
			case e2b && len(spaces) != 1:
				return fmt.Errorf("--e2b: an E2B key is for exactly one space; name it with --spaces A (got %d)", len(spaces))
			case e2b:
				req.Purpose = torporv1.TokenPurpose_TOKEN_PURPOSE_E2B
			case len(spaces) > 0:
				req.Purpose = torporv1.TokenPurpose_TOKEN_PURPOSE_API
			default:
				return fmt.Errorf("name --node NAME (a node join token), --client NAME --role ROLE (a client join token) or --spaces A,B (an API token)")
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
			fmt.Fprintf(w, "token:          %s\nid:             %s\nexpires:        %s\n", resp.GetToken(), resp.GetId(), timestamp(resp.GetExpireTime().AsTime()))
			switch {
			case node != "":
				fmt.Fprintf(w, "ca-fingerprint: %s\n\nJoin the node (once; it keeps its certificate in its state directory):\n  torpor node --name %s --join-token %s --ca-fingerprint %s\n",
					resp.GetCaFingerprint(), node, resp.GetToken(), resp.GetCaFingerprint())
			case role == "router":
				fmt.Fprintf(w, "ca-fingerprint: %s\n\nStart the router (once with the token; it keeps its certificate in its state directory):\n  torpor router --name %s --join-token %s --ca-fingerprint %s\n",
					resp.GetCaFingerprint(), client, resp.GetToken(), resp.GetCaFingerprint())
			case client != "":
				fmt.Fprintf(w, "ca-fingerprint: %s\n\nLog the CLI in as %s (once; it keeps the certificate next to its config file):\n  torpor login --name %s --join-token %s --ca-fingerprint %s\n",
					resp.GetCaFingerprint(), client, client, resp.GetToken(), resp.GetCaFingerprint())
			case e2b:
				fmt.Fprintf(w, "\nUse it with the E2B SDK for the sandboxes of space %s: E2B_API_KEY=%s\n(it also works as an API token: torpor --token %s ...)\n", spaces[0], resp.GetToken(), resp.GetToken())
			default:
				fmt.Fprintf(w, "\nUse it for spaces %s: torpor --token %s ...\n", strings.Join(spaces, ", "), resp.GetToken())
			}
			return nil
		},
	}
	flags := create.Flags()
	flags.StringVar(&node, "node", "", "make a join token for this node")
	flags.StringVar(&client, "client", "", "make a join token for this API client (with --role)")
	flags.StringVar(&role, "role", "", "the client's role: router, user or admin")
	flags.StringSliceVar(&spaces, "spaces", nil, "spaces of the API token or client (comma-separated)")
	flags.BoolVar(&e2b, "e2b", false, "make an E2B API key (e2b_...) for the one space --spaces names")
	flags.DurationVar(&ttl, "ttl", 0, "lifetime (default 1h for a join token, 24h for an API token, 8760h for an E2B key; at most 8760h)")
	return create
}

func newTokenListCommand(a *app) *cobra.Command {
	return identityList(a, "List the tokens that are neither used nor expired (never their secrets)", "  torpor token list",
		func(c torporv1connect.IdentityServiceClient) listRPC[torporv1.ListTokensRequest, torporv1.ListTokensResponse] {
			return c.ListTokens
		},
		[]string{"ID", "PURPOSE", "NAME", "ROLE", "SPACES", "AGE", "EXPIRES"},
		func(resp *torporv1.ListTokensResponse, now time.Time) [][]string {
			rows := make([][]string, 0, len(resp.GetTokens()))
			for _, t := range resp.GetTokens() {
				rows = append(rows, []string{
					shortID(t.GetId()), enumName(t.GetPurpose()), t.GetName(), strings.ToLower(enumName(t.GetRole())),
					strings.Join(t.GetSpaces(), ","), age(t.GetCreateTime(), now), timestamp(t.GetExpireTime().AsTime()),
				})
			}
			return rows
		})
}

// shortID is enough of a token's id to revoke it by.
func shortID(id string) string { return id[:min(len(id), 12)] }

func newTokenRevokeCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "revoke ID",
		Example: "  torpor token revoke 3f2a9c0d1e4b",
		Short:   "Revoke a token before it is used or expires (ID as torpor token list shows it)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), c.identity.RevokeToken, &torporv1.RevokeTokenRequest{Id: args[0]})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "token %s (%s) revoked\n", shortID(resp.GetToken().GetId()), strings.ToLower(enumName(resp.GetToken().GetPurpose())))
			return nil
		},
	}
}
