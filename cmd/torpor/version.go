package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/version"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Example: "  torpor version",
		Short:   "Print the version, commit, commit time and Go version of this binary",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprint(cmd.OutOrStdout(), version.Get().Long())
			return err
		},
	}
}
