// Command torpor is Torpor's single binary: the process roles (server,
// node, router, up) and the API client (space, template, actor, worker,
// snapshot).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/cli"
	"github.com/torpor-dev/torpor/internal/envd"
	"github.com/torpor-dev/torpor/internal/guestfs"
	"github.com/torpor-dev/torpor/internal/version"
)

// processCommands are the process roles. Each lives in its own file and
// adds its constructor from init, so adding a role touches no other file.
var processCommands []func() *cobra.Command

func register(newCommand func() *cobra.Command) {
	processCommands = append(processCommands, newCommand)
}

func main() {
	// The file helper the node runs inside sandboxes: no flags, no
	// command tree, nothing else (see internal/guestfs).
	if len(os.Args) > 1 && os.Args[1] == guestfs.Command {
		os.Exit(guestfs.Main(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	// The E2B in-sandbox API the node starts inside E2B sandboxes (see
	// internal/envd), likewise outside the command tree.
	if len(os.Args) > 1 && os.Args[1] == envd.Command {
		os.Exit(envd.Main(os.Args[2:], os.Stdin, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	root := cli.NewRoot()
	root.Version = version.Get().String()
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(newVersionCommand())
	addProcessCommands(root)
	code := cli.Execute(ctx, root, os.Args[1:])
	stop()
	os.Exit(code)
}
