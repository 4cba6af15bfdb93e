package cli

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// completeTimeout bounds the listing a shell completion waits for.
const completeTimeout = 3 * time.Second

// completeNames completes the names of k's objects in the space the
// command line selects (flags are parsed before completion). A verb of one
// name completes its first argument only; names already given are not
// offered again.
func (k *kind[T]) completeNames(a *app, several bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 && !several {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		if f := cmd.Flag("space"); f != nil {
			a.spaceSet = f.Changed
		}
		c, err := a.clients()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		ctx, cancel := context.WithTimeout(context.Background(), completeTimeout)
		defer cancel()
		items, err := k.listAll(ctx, c, k.space(a))
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		var names []cobra.Completion
		for _, item := range items {
			name := item.GetMetadata().GetName()
			if strings.HasPrefix(name, toComplete) && !slices.Contains(args, name) {
				names = append(names, name)
			}
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeObjectNames gives every verb of noun whose first argument is a
// NAME (as its usage line says: NAME, NAME..., [NAME...], NAME[@REV]) the
// completion of the names of its objects; create names a new one, and a
// verb with a completion of its own keeps it.
func completeObjectNames[T object](noun *cobra.Command, a *app, k *kind[T]) {
	for _, verb := range noun.Commands() {
		fields := strings.Fields(verb.Use)
		if len(fields) < 2 || verb.ValidArgsFunction != nil || verb.Name() == "create" {
			continue
		}
		arg := strings.Trim(fields[1], "[]")
		if !strings.HasPrefix(arg, "NAME") {
			continue
		}
		verb.ValidArgsFunction = k.completeNames(a, strings.HasSuffix(arg, "..."))
	}
}
