package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// object is what every API record has in common.
type object interface {
	proto.Message
	GetMetadata() *torporv1.ObjectMeta
}

// column is one table column after NAME (AGE is always last).
type column[T object] struct {
	header string
	value  func(T) string
}

// kind tells the shared verbs (get, list, describe, delete) how to reach
// and show one resource type.
type kind[T object] struct {
	name   string // singular, as printed in "actor/NAME created"
	plural string
	// sample is a name of one, for the verbs' examples.
	sample string
	spaced bool // lives in a space (every kind but spaces themselves)
	// defaultSpace, when set, replaces the --space default for this kind.
	defaultSpace string
	columns      []column[T]
	// wide are more columns for -o wide, before LABELS.
	wide   []column[T]
	get    func(context.Context, *clients, *torporv1.GetRequest) (T, error)
	list   func(context.Context, *clients, *torporv1.ListRequest) (items []T, nextPage string, err error)
	delete func(context.Context, *clients, *torporv1.DeleteRequest) error
	// deleteFlag, when set, is the kind's own flag of delete.
	deleteFlag *deleteFlag
	// describeMore, when set, adds to describe what is not in the record
	// (an actor's URL and recent events).
	describeMore func(ctx context.Context, c *clients, w io.Writer, item T, now time.Time) error
}

// deleteFlag is a boolean flag of a kind's delete and what it sets in
// the request.
type deleteFlag struct {
	name, usage string
	set         func(*torporv1.DeleteRequest)
}

// call runs one unary RPC and unwraps its response.
func call[Req, Resp any](ctx context.Context, rpc func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req) (*Resp, error) {
	resp, err := rpc(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// nounCommand is the `torpor <noun>` group with the shared verbs; callers
// add the kind's own verbs (create, update, apply).
func (k *kind[T]) nounCommand(a *app, short string) *cobra.Command {
	noun := &cobra.Command{
		Use:     k.name,
		Aliases: []string{k.plural},
		Short:   short,
		Example: k.example("list", "get %s -o yaml", "describe %s"),
		// Runnable with no arguments, so a mistyped verb is an error
		// rather than a help page and exit status 0.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	noun.AddCommand(k.getCommand(a), k.listCommand(a), k.describeCommand(a), k.deleteCommand(a))
	return noun
}

// example is the help's example lines `torpor <kind> <verb...>`, %s in
// each standing for the kind's sample name.
func (k *kind[T]) example(lines ...string) string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = "  torpor " + k.name + " " + strings.ReplaceAll(l, "%s", k.sample)
	}
	return strings.Join(out, "\n")
}

func (k *kind[T]) space(a *app) string {
	switch {
	case !k.spaced:
		return ""
	case k.defaultSpace != "" && !a.spaceSet:
		return k.defaultSpace
	}
	return a.space
}

func (k *kind[T]) getCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "get [NAME...]",
		Short:   fmt.Sprintf("Show %s (all of them without names)", k.plural),
		Example: k.example("get %s", "get %s -o yaml", "get -o jsonpath='{.items[*].metadata.name}'"),
		RunE: func(cmd *cobra.Command, names []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			if len(names) == 0 {
				items, err := k.listAll(cmd.Context(), c, k.space(a))
				if err != nil {
					return err
				}
				return k.print(cmd, a, items, true, false)
			}
			items, err := k.getEach(cmd.Context(), c, k.space(a), names)
			if err != nil {
				return err
			}
			return k.print(cmd, a, items, len(names) > 1, false)
		},
	}
}

func (k *kind[T]) listCommand(a *app) *cobra.Command {
	var (
		allSpaces bool
		labels    string
		watch     bool
	)
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List " + k.plural,
		Example: k.example("list", "list -l team=a -o wide", "list -w"),
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, err := parseSelector(labels)
			if err != nil {
				return err
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			space := k.space(a)
			if allSpaces {
				space = ""
			}
			list := func() ([]T, error) {
				items, err := k.listAll(cmd.Context(), c, space)
				return filter(sel, items), err
			}
			items, err := list()
			if err != nil {
				return err
			}
			if err := k.print(cmd, a, items, true, allSpaces); err != nil || !watch {
				return err
			}
			return k.watch(cmd, a, list, items, allSpaces)
		},
	}
	if k.spaced {
		cmd.Flags().BoolVarP(&allSpaces, "all-spaces", "A", false, "list "+k.plural+" in every space")
	}
	cmd.Flags().StringVarP(&labels, "labels", "l", "", "only "+k.plural+" whose labels match: k=v, k!=v, k (has it), !k (has it not), joined by commas")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "after the list, print "+k.plural+" as they change, until interrupted")
	return cmd
}

func (k *kind[T]) describeCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "describe NAME...",
		Short:   fmt.Sprintf("Show %s in detail", k.plural),
		Example: k.example("describe %s"),
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			items, err := k.getEach(cmd.Context(), c, k.space(a), names)
			if err != nil {
				return err
			}
			now := time.Now()
			for i, item := range items {
				if i > 0 {
					fmt.Fprintln(cmd.OutOrStdout())
				}
				describe(cmd.OutOrStdout(), item, now)
				if k.describeMore != nil {
					if err := k.describeMore(cmd.Context(), c, cmd.OutOrStdout(), item, now); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
}

func (k *kind[T]) deleteCommand(a *app) *cobra.Command {
	var flag bool
	examples := []string{"delete %s"}
	if k.deleteFlag != nil {
		examples = append(examples, "delete %s --"+k.deleteFlag.name)
	}
	cmd := &cobra.Command{
		Use:     "delete NAME...",
		Short:   "Delete " + k.plural + " (each one named; a failure does not stop the others)",
		Example: k.example(examples...),
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			return eachName(cmd, k.name, k.plural, names, func(name string) error {
				req := &torporv1.DeleteRequest{Space: k.space(a), Name: name}
				if flag {
					k.deleteFlag.set(req)
				}
				if err := k.delete(cmd.Context(), c, req); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s/%s deleted\n", k.name, name)
				return nil
			})
		},
	}
	if k.deleteFlag != nil {
		cmd.Flags().BoolVar(&flag, k.deleteFlag.name, false, k.deleteFlag.usage)
	}
	return cmd
}

func (k *kind[T]) getEach(ctx context.Context, c *clients, space string, names []string) ([]T, error) {
	items := make([]T, 0, len(names))
	for _, name := range names {
		item, err := k.get(ctx, c, &torporv1.GetRequest{Space: space, Name: name})
		if err != nil {
			return nil, err
		}
		items = append(items, item)
	}
	return items, nil
}

// listAll follows page tokens to the end of the listing.
func (k *kind[T]) listAll(ctx context.Context, c *clients, space string) ([]T, error) {
	var all []T
	req := &torporv1.ListRequest{Space: space}
	for {
		items, next, err := k.list(ctx, c, req)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		req.PageToken = next
	}
}

// print shows items in the -o format; withSpace adds a SPACE column to
// tables listing several spaces.
func (k *kind[T]) print(cmd *cobra.Command, a *app, items []T, asList, withSpace bool) error {
	if len(items) == 0 && asList && a.output == formatTable {
		// Like kubectl, on stderr, so a script reading stdout sees nothing.
		_, err := fmt.Fprintf(cmd.ErrOrStderr(), "No %s found.\n", k.plural)
		return err
	}
	return k.printItems(cmd.OutOrStdout(), a, items, asList, withSpace, true)
}

// printItems writes items in the -o format, tables with their header row
// or without (a watch's later rows).
func (k *kind[T]) printItems(w io.Writer, a *app, items []T, asList, withSpace, header bool) error {
	switch {
	case a.output != formatTable:
		msgs := make([]proto.Message, len(items))
		for i, item := range items {
			msgs[i] = item
		}
		return printMessages(w, a.output, msgs, asList)
	case a.style == formatName:
		for _, item := range items {
			if _, err := fmt.Fprintf(w, "%s/%s\n", k.name, item.GetMetadata().GetName()); err != nil {
				return err
			}
		}
		return nil
	}
	columns := k.columns
	if a.style == formatWide {
		columns = append(append(slices.Clip(columns), k.wide...), column[T]{"LABELS", func(item T) string { return formatLabels(item.GetMetadata().GetLabels()) }})
	}
	var headers []string
	if header {
		headers = []string{"NAME"}
		if withSpace {
			headers = append(headers, "SPACE")
		}
		for _, col := range columns {
			headers = append(headers, col.header)
		}
		headers = append(headers, "AGE")
	}
	now := time.Now()
	rows := make([][]string, len(items))
	for i, item := range items {
		row := []string{item.GetMetadata().GetName()}
		if withSpace {
			row = append(row, item.GetMetadata().GetSpace())
		}
		for _, col := range columns {
			row = append(row, col.value(item))
		}
		rows[i] = append(row, age(item.GetMetadata().GetCreateTime(), now))
	}
	return printTable(w, headers, rows)
}

// formatLabels is k=v,... in key order.
func formatLabels(labels map[string]string) string {
	pairs := make([]string, 0, len(labels))
	for _, key := range slices.Sorted(maps.Keys(labels)) {
		pairs = append(pairs, key+"="+labels[key])
	}
	return strings.Join(pairs, ",")
}

// printChanged reports a create or update: "actor/NAME created" for
// tables, the object itself for json and yaml.
func (k *kind[T]) printChanged(w io.Writer, format string, item T, verb string) error {
	if format != formatTable {
		return printMessages(w, format, []proto.Message{item}, false)
	}
	_, err := fmt.Fprintf(w, "%s/%s %s\n", k.name, item.GetMetadata().GetName(), verb)
	return err
}
