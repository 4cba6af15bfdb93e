package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func newActorEventsCommand(a *app) *cobra.Command {
	var watch bool
	cmd := &cobra.Command{
		Use:     "events NAME [-w]",
		Example: "  torpor actor events c1\n  torpor actor events c1 -w",
		Short:   "Show an actor's state history",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			list := func(ctx context.Context) ([]*torporv1.ActorEvent, error) {
				resp, err := call(ctx, c.actors.ListActorEvents, &torporv1.GetRequest{Space: a.space, Name: args[0]})
				return resp.GetEvents(), err
			}
			events, err := list(cmd.Context())
			if err != nil {
				return err
			}
			if len(events) == 0 && !watch && a.output == formatTable {
				_, err := fmt.Fprintln(cmd.ErrOrStderr(), "No events found.")
				return err
			}
			if err := printEvents(cmd, a, events, true, !watch); err != nil || !watch {
				return err
			}
			// Events are only ever appended: the new ones are past the
			// count already shown.
			shown := len(events)
			return poll(cmd.Context(), func() error {
				events, err := list(cmd.Context())
				if err != nil || len(events) <= shown {
					return err
				}
				err = printEvents(cmd, a, events[shown:], false, false)
				shown = len(events)
				return err
			})
		},
	}
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "after the history, print new events as they happen, until interrupted")
	return cmd
}

// printEvents writes events as table rows (under the header when header
// is set) or, for json and yaml, as the whole response (whole) or one
// document per event (a watch).
func printEvents(cmd *cobra.Command, a *app, events []*torporv1.ActorEvent, header, whole bool) error {
	w := cmd.OutOrStdout()
	if a.output != formatTable {
		if whole {
			return printMessages(w, a.output, []proto.Message{&torporv1.ListActorEventsResponse{Events: events}}, false)
		}
		for _, e := range events {
			if err := printMessages(w, a.output, []proto.Message{e}, false); err != nil {
				return err
			}
		}
		return nil
	}
	var headers []string
	if header {
		headers = eventHeaders
	}
	return printTable(w, headers, eventRows(events))
}

var eventHeaders = []string{"TIME", "FROM", "TO", "WORKER", "TOOK", "REASON"}

// eventRows are events as table rows, under eventHeaders.
func eventRows(events []*torporv1.ActorEvent) [][]string {
	rows := make([][]string, len(events))
	for i, e := range events {
		var took string
		if e.GetDurationMs() > 0 {
			took = (time.Duration(e.GetDurationMs()) * time.Millisecond).String()
		}
		rows[i] = []string{
			timestamp(e.GetTime().AsTime()),
			enumName(e.GetFromState()),
			enumName(e.GetToState()),
			e.GetWorker(),
			took,
			e.GetReason(),
		}
	}
	return rows
}
