package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/flagconfig"
)

// addProcessCommands adds the process roles to root, each taking every
// setting from its flag, else its environment variable, else the config
// file (flagconfig), and each outliving the readers of its output.
func addProcessCommands(root *cobra.Command) []*cobra.Command {
	cmds := make([]*cobra.Command, len(processCommands))
	names := make([]string, len(processCommands))
	for i, newCommand := range processCommands {
		cmds[i] = newCommand()
		names[i] = cmds[i].Name()
	}
	for _, cmd := range cmds {
		cmd.PersistentFlags().String(flagconfig.ConfigFlag, "",
			"YAML file of settings, flag names as keys (a section named after the command wins for it); flags, then TORPOR_<FLAG> variables, win over it (default $TORPOR_CONFIG)")
		cmd.PersistentPreRunE = func(c *cobra.Command, _ []string) error {
			survivePipeReaders()
			return flagconfig.Apply(c.LocalFlags(), c.Name(), names, os.LookupEnv)
		}
		root.AddCommand(cmd)
	}
	return cmds
}
