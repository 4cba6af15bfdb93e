package main

import (
	"errors"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/gateproc"
	"github.com/torpor-dev/torpor/internal/runtime/gvisor"
	"github.com/torpor-dev/torpor/internal/slotgate"
)

// newNodeGateCommand is `torpor node gate`, the slot gate as a process of
// its own, which the node agent starts (internal/gateproc); hidden, since
// no one else runs it.
func newNodeGateCommand(logs *logFlags) *cobra.Command {
	var opts gateproc.Options
	cmd := &cobra.Command{
		Use:    "gate",
		Short:  "The node's slot gate as its own process (started by the node agent)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.StateDir == "" || opts.Listen == "" {
				return errors.New("--state-dir and --listen: required")
			}
			logger, err := logs.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			opts.Logger = logger
			// The node's runtime is gVisor's wherever slots freeze: a
			// freeze's control is a sandbox's control socket.
			opts.Pausers = func(control string) slotgate.Pauser { return gvisor.Pauser(control) }
			// The agent's session and terminal are not the gate's: it
			// stops when the agent asks it to, or on SIGTERM.
			signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
			return gateproc.Run(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.StateDir, "state-dir", "", "the node's state directory")
	cmd.Flags().StringVar(&opts.Listen, "listen", "", "address of the slot gate")
	return cmd
}

// gateCommand is how the node agent starts its slot gate: this binary's
// `node gate`.
func gateCommand() ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return []string{self, "node", "gate"}, nil
}
