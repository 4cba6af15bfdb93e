package cli

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
)

// waitPoll is how often actor wait looks again.
const waitPoll = 250 * time.Millisecond

func newActorWaitCommand(a *app) *cobra.Command {
	var (
		condition string
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "wait NAME... --for=state=STATE [--timeout 5m]",
		Short: "Wait until actors are in a state (RUNNING, SUSPENDED, ...), as kubectl wait does",
		Long: "Wait until each named actor is in the state --for names, then print it. The wait\n" +
			"only reads: it resumes or suspends nothing. It fails when --timeout passes first,\n" +
			"naming the actors not there yet and their states, or when an actor does not exist.",
		Example: "  torpor actor wait c1 --for=state=RUNNING --timeout 2m\n" +
			"  torpor actor wait c1 c2 --for=state=SUSPENDED",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			want, err := parseWaitFor(condition)
			if err != nil {
				return err
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			pending, last := names, map[string]string{}
			for {
				var still []string
				for _, name := range pending {
					actor, err := call(ctx, c.actors.GetActor, &torporv1.GetRequest{Space: a.space, Name: name})
					switch {
					case err != nil && ctx.Err() != nil:
						still = append(still, name)
						continue
					case err != nil:
						return err
					}
					if st := actor.GetStatus().GetState(); st != want {
						still = append(still, name)
						last[name] = enum.Name(st)
						continue
					}
					if err := actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, "is "+enum.Name(want)); err != nil {
						return err
					}
				}
				if len(still) == 0 {
					return nil
				}
				pending = still
				select {
				case <-ctx.Done():
					if err := cmd.Context().Err(); err != nil {
						return err
					}
					states := make([]string, len(still))
					for i, name := range still {
						states[i] = name + " is " + cmp.Or(last[name], "not read yet")
					}
					return fmt.Errorf("timed out after %s waiting for state %s: %s", timeout, enum.Name(want), strings.Join(states, ", "))
				case <-time.After(waitPoll):
				}
			}
		},
	}
	cmd.Flags().StringVar(&condition, "for", "", "the condition to wait for: state=STATE (RUNNING, SUSPENDED, PAUSED, CRASHED, ...)")
	cmd.Flags().DurationVar(&timeout, "timeout", defaultTimeout, "how long to wait at most (e.g. --timeout 2m)")
	return cmd
}

// parseWaitFor reads --for=state=STATE, the state as the tables name it
// (case aside).
func parseWaitFor(s string) (torporv1.ActorState, error) {
	key, value, ok := strings.Cut(s, "=")
	if !ok || key != "state" || value == "" {
		return 0, fmt.Errorf("--for %q: want state=STATE, e.g. --for=state=RUNNING", s)
	}
	values := torporv1.ActorState(0).Descriptor().Values()
	var names []string
	for i := range values.Len() {
		v := values.Get(i)
		if v.Number() == 0 {
			continue
		}
		name := enum.Name(torporv1.ActorState(v.Number()))
		if strings.EqualFold(name, value) {
			return torporv1.ActorState(v.Number()), nil
		}
		names = append(names, name)
	}
	return 0, fmt.Errorf("--for state=%s: no such state; want one of %s", value, strings.Join(names, ", "))
}
