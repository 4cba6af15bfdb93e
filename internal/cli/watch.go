package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

// watchInterval is how often -w lists again. The API has no change feed
// for clients, so a watch polls; a second keeps the load of a few
// watching terminals negligible.
const watchInterval = time.Second

// watch lists again every watchInterval until the command's context
// ends, printing the items that are new or changed since (by uid and
// version) and naming those gone.
func (k *kind[T]) watch(cmd *cobra.Command, a *app, list func() ([]T, error), seen []T, withSpace bool) error {
	versions := map[string]int64{}
	names := map[string]string{}
	for _, item := range seen {
		versions[item.GetMetadata().GetUid()] = item.GetMetadata().GetVersion()
		names[item.GetMetadata().GetUid()] = item.GetMetadata().GetName()
	}
	return poll(cmd.Context(), func() error {
		items, err := list()
		if err != nil {
			return err
		}
		var changed []T
		now := map[string]int64{}
		for _, item := range items {
			m := item.GetMetadata()
			if v, ok := versions[m.GetUid()]; !ok || v != m.GetVersion() {
				changed = append(changed, item)
			}
			now[m.GetUid()] = m.GetVersion()
			names[m.GetUid()] = m.GetName()
		}
		batches := [][]T{changed} // one table of rows
		if a.output != formatTable {
			batches = nil // one document each
			for _, item := range changed {
				batches = append(batches, []T{item})
			}
		}
		for _, batch := range batches {
			if err := k.printItems(cmd.OutOrStdout(), a, batch, false, withSpace, false); err != nil {
				return err
			}
		}
		for uid := range versions {
			if _, ok := now[uid]; !ok {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s/%s deleted\n", k.name, names[uid])
			}
		}
		versions = now
		return nil
	})
}

// poll calls fn every watchInterval until ctx ends (a watch's normal end,
// Ctrl-C) or fn fails.
func poll(ctx context.Context, fn func() error) error {
	ticker := time.NewTicker(watchInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		if err := fn(); err != nil {
			if ctx.Err() != nil {
				return nil // the call was cut short by the end
			}
			return err
		}
	}
}
