package cli

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
)

// errorText is err as the command line reports it: an API error as
// "<code>: <message>".
func errorText(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return fmt.Sprintf("%s: %s", ce.Code(), ce.Message())
	}
	return err.Error()
}

// eachName runs do for every name, going on past failures: each is
// reported on stderr as it happens, and the verb fails at the end if one
// did. A single name's error is returned as it is.
func eachName(cmd *cobra.Command, kind, plural string, names []string, do func(name string) error) error {
	if len(names) == 1 {
		return do(names[0])
	}
	failed := 0
	for _, name := range names {
		if err := do(name); err != nil {
			failed++
			fmt.Fprintf(cmd.ErrOrStderr(), "Error: %s/%s: %s\n", kind, name, errorText(err))
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d %s failed", failed, len(names), plural)
	}
	return nil
}
