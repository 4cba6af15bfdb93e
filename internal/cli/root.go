// Package cli is Torpor's command line client: `torpor <noun> <verb>` over
// the connect API, plus the helpers (config and data paths) the process
// commands in cmd/torpor share with it.
package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/client"
)

// Output formats accepted by -o.
const (
	formatTable = "table"
	formatJSON  = "json"
	formatYAML  = "yaml"
	// wide and name are table styles: listings add columns, or print
	// KIND/NAME alone; other output shows them as a table.
	formatWide = "wide"
	formatName = "name"
	// formatJSONPath prefixes -o jsonpath=TEMPLATE: the JSON form, then
	// the template (kubectl's JSONPath) applied to it.
	formatJSONPath = "jsonpath="
)

// app holds what the global flags select, read when a command runs (after
// flag parsing).
type app struct {
	serverFlag string
	caFlag     string
	tokenFlag  string
	space      string
	// spaceSet: --space was given (kinds with a default space of their
	// own, like workers, use it only then).
	spaceSet bool
	output   string
	// style is formatWide or formatName when -o chose one (output is
	// then formatTable).
	style string
}

// clients are the API services, bound to one server address.
type clients struct {
	spaces    torporv1connect.SpaceServiceClient
	templates torporv1connect.TemplateServiceClient
	actors    torporv1connect.ActorServiceClient
	workers   torporv1connect.WorkerServiceClient
	snapshots torporv1connect.SnapshotServiceClient
	identity  torporv1connect.IdentityServiceClient
	// router and domain are where actors are reached, for the URLs
	// describe shows.
	router, domain string
}

func (a *app) clients() (*clients, error) {
	conn, err := client.Discover(client.Options{Server: a.serverFlag, CAFile: a.caFlag, Token: a.tokenFlag})
	if err != nil {
		return nil, err
	}
	c, err := client.New(conn)
	if err != nil {
		return nil, err
	}
	return &clients{
		spaces:    c.Spaces,
		templates: c.Templates,
		actors:    c.Actors,
		workers:   c.Workers,
		snapshots: c.Snapshots,
		identity:  c.Identity,
		router:    conn.Router,
		domain:    conn.Domain,
	}, nil
}

// NewRoot builds the `torpor` command with the API client commands (space,
// template, actor, worker, snapshot, token). Process commands (server,
// node, router, up) are added by the caller with AddCommand.
func NewRoot() *cobra.Command {
	a := &app{}
	root := &cobra.Command{
		Use:           "torpor",
		Example:       "  torpor template apply -f examples/counter/template.yaml --wait\n  torpor actor create c1 --template counter\n  torpor actor get c1 -o jsonpath='{.status.state}'",
		Short:         "Run many stateful, sandboxed actors on a few warm workers",
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if f := cmd.Flag("space"); f != nil {
				a.spaceSet = f.Changed
			}
			switch a.output {
			case formatTable, formatJSON, formatYAML:
				return nil
			case formatWide, formatName:
				a.style, a.output = a.output, formatTable
				return nil
			}
			if template, ok := strings.CutPrefix(a.output, formatJSONPath); ok {
				_, err := parseJSONPath(template)
				return err
			}
			return fmt.Errorf("-o %q: want table, wide, name, json, yaml or jsonpath=TEMPLATE", a.output)
		},
	}
	flags := root.PersistentFlags()
	flags.StringVar(&a.serverFlag, "server", "", "API server URL (default: $TORPOR_SERVER, else server: in the client config file, else "+client.DefaultServer+")")
	flags.StringVar(&a.caFlag, "ca", "", "file of the CA certificate (PEM) the server's certificate must chain to (default: $TORPOR_CA, else ca: in the client config file, else the system's roots)")
	flags.StringVar(&a.tokenFlag, "token", "", "API token (default: $TORPOR_TOKEN, else token: in the client config file)")
	flags.StringVar(&a.space, "space", "default", "space of the objects to act on")
	flags.StringVarP(&a.output, "output", "o", formatTable, "output format: table, wide (more columns), name (KIND/NAME lines), json, yaml, or jsonpath=TEMPLATE (kubectl's JSONPath over the JSON form: -o jsonpath='{.status.state}')")
	spaces, templates, actors, workers, snapshots := newSpaceCommand(a), newTemplateCommand(a), newActorCommand(a), newWorkerCommand(a), newSnapshotCommand(a)
	completeObjectNames(spaces, a, spaceKind)
	completeObjectNames(templates, a, templateKind)
	completeObjectNames(actors, a, actorKind)
	completeObjectNames(workers, a, workerKind)
	if untag, _, err := snapshots.Find([]string{"untag"}); err == nil {
		untag.ValidArgsFunction = tagKind.completeNames(a, true) // its names are tags'
	}
	completeObjectNames(snapshots, a, snapshotKind)
	root.AddCommand(
		spaces,
		templates,
		actors,
		workers,
		snapshots,
		newTokenCommand(a),
		newClientCommand(a),
		newLoginCommand(a),
		newImageCommand(),
	)
	for _, noun := range root.Commands() {
		refuseUnknownVerbs(noun)
	}
	return root
}

// refuseUnknownVerbs makes a command with subcommands, and those below it,
// refuse an unknown subcommand with kubectl's "did you mean" (cobra
// suggests only below the root) instead of showing help with status 0.
func refuseUnknownVerbs(cmd *cobra.Command) {
	if !cmd.HasSubCommands() {
		return
	}
	cmd.SuggestionsMinimumDistance = 2 // cobra's default, which it sets only on the root
	cmd.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if suggestions := cmd.SuggestionsFor(args[0]); len(suggestions) > 0 {
			msg += "\n\nDid you mean this?\n\t" + strings.Join(suggestions, "\n\t")
		}
		return fmt.Errorf("%s\n\nRun '%s --help' for its commands", msg, cmd.CommandPath())
	}
	if cmd.RunE == nil && cmd.Run == nil {
		cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	for _, sub := range cmd.Commands() {
		refuseUnknownVerbs(sub)
	}
}

// Execute runs root with args and returns the process exit code. Errors go
// to root's error stream as "Error: <message>"; API errors as
// "Error: <code>: <message>".
func Execute(ctx context.Context, root *cobra.Command, args []string) int {
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var exit exitCode
	if errors.As(err, &exit) {
		return int(exit)
	}
	fmt.Fprintf(root.ErrOrStderr(), "Error: %s\n", errorText(err))
	return 1
}
