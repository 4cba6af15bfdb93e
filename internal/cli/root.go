// Package cli is Torpor's command line client: `torpor <noun> <verb>` over
// the connect API, plus the helpers (config and data paths) the process
// commands in cmd/torpor share with it.
package cli

import (
	"context"
	"errors"
	"fmt"

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
			return fmt.Errorf("-o %q: want table, wide, name, json or yaml", a.output)
		},
	}
	flags := root.PersistentFlags()
	flags.StringVar(&a.serverFlag, "server", "", "API server URL (default: $TORPOR_SERVER, else server: in the client config file, else "+client.DefaultServer+")")
	flags.StringVar(&a.caFlag, "ca", "", "file of the CA certificate (PEM) the server's certificate must chain to (default: $TORPOR_CA, else ca: in the client config file, else the system's roots)")
	flags.StringVar(&a.tokenFlag, "token", "", "API token (default: $TORPOR_TOKEN, else token: in the client config file)")
	flags.StringVar(&a.space, "space", "default", "space of the objects to act on")
	flags.StringVarP(&a.output, "output", "o", formatTable, "output format: table, wide (more columns), name (KIND/NAME lines), json or yaml")
	root.AddCommand(
		newSpaceCommand(a),
		newTemplateCommand(a),
		newActorCommand(a),
		newWorkerCommand(a),
		newSnapshotCommand(a),
		newTokenCommand(a),
		newClientCommand(a),
		newLoginCommand(a),
		newImageCommand(),
	)
	return root
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
