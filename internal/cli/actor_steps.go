package cli

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/retry"
)

// actorStep is an RPC that moves one actor, named by a GetRequest.
type actorStep func(context.Context, *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error)

func newActorResumeCommand(a *app) *cobra.Command {
	var flags torporv1.ResumeActorRequest
	var wait waitFlags
	cmd := &cobra.Command{
		Use:     "resume NAME... [--wait [--timeout 5m]]",
		Example: "  torpor actor resume c1\n  torpor actor resume c1 c2 --wait --timeout 2m",
		Short:   "Bring actors to RUNNING on free workers (normally the router does this on demand)",
		Long: "Bring each actor to RUNNING on a free worker; one already RUNNING stays as it is\n" +
			"(and counts as active). A resume that finds no free worker, and no idle actor to\n" +
			"evict, fails at once; with --wait it is tried again until a worker frees or\n" +
			"--timeout passes.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			return stepActors(cmd, a, &wait, names, "resumed", "already running", torporv1.ActorState_ACTOR_STATE_RUNNING,
				func(ctx context.Context, c *clients, name string) (*torporv1.Actor, error) {
					req := proto.CloneOf(&flags)
					req.Space, req.Name = a.space, name
					return call(ctx, c.actors.ResumeActor, req)
				})
		},
	}
	cmd.Flags().BoolVar(&flags.Boot, "boot", false, "cold-boot an actor that has no state instead of restoring the golden snapshot")
	cmd.Flags().StringVar(&flags.Snapshot, "snapshot", "", "restore this kept snapshot instead of the latest")
	cmd.Flags().BoolVar(&flags.AllowStateLoss, "allow-state-loss", false, "accept restoring a snapshot taken under another template revision that loses state (named in the refusal)")
	wait.register(cmd, "each actor is RUNNING, trying again while no worker is free")
	return cmd
}

func newActorCheckpointCommand(a *app, verb, past, short string, rpc func(*clients) actorStep) *cobra.Command {
	done := map[string]torporv1.ActorState{"suspended": torporv1.ActorState_ACTOR_STATE_SUSPENDED, "paused": torporv1.ActorState_ACTOR_STATE_PAUSED}[past]
	var wait waitFlags
	cmd := &cobra.Command{
		Use:     verb + " NAME... [--wait [--timeout 5m]]",
		Example: "  torpor actor " + verb + " c1\n  torpor actor " + verb + " c1 c2 --wait",
		Short:   short,
		Long: short + ". The call returns once the checkpoint is written; an actor still\n" +
			"resuming is first waited for. With --wait, a call the control plane could not\n" +
			"take (restarting, or a concurrent change) is tried again until --timeout passes.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			return stepActors(cmd, a, &wait, names, past, "already "+past, done,
				func(ctx context.Context, c *clients, name string) (*torporv1.Actor, error) {
					return call(ctx, rpc(c), &torporv1.GetRequest{Space: a.space, Name: name})
				})
		},
	}
	wait.register(cmd, "each actor is "+past)
	return cmd
}

// stepActors moves each named actor with step, reporting "actor/NAME
// <past>", or "actor/NAME <already>" for one that was in state done
// before.
func stepActors(cmd *cobra.Command, a *app, wait *waitFlags, names []string, past, already string, done torporv1.ActorState,
	step func(context.Context, *clients, string) (*torporv1.Actor, error)) error {
	c, err := a.clients()
	if err != nil {
		return err
	}
	return eachName(cmd, "actor", "actors", names, func(name string) error {
		before, err := call(cmd.Context(), c.actors.GetActor, &torporv1.GetRequest{Space: a.space, Name: name})
		if err != nil {
			return err
		}
		var actor *torporv1.Actor
		if err := wait.retry(cmd.Context(), "actor "+name, func(ctx context.Context) error {
			actor, err = step(ctx, c, name)
			return err
		}); err != nil {
			return err
		}
		verb := past
		if before.GetStatus().GetState() == done {
			verb = already
		}
		return actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, verb)
	})
}

// retry calls step once, or under --wait again while it fails for a
// reason that passes (no free worker, control plane unavailable, a
// concurrent change), until --timeout.
func (w *waitFlags) retry(ctx context.Context, what string, step func(context.Context) error) error {
	if !w.on {
		return step(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	transient := func(err error) bool {
		switch connect.CodeOf(err) {
		case connect.CodeResourceExhausted, connect.CodeUnavailable, connect.CodeAborted:
			return true
		}
		return false
	}
	err := retry.Do(ctx, retry.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second}, transient, step)
	if err != nil && ctx.Err() != nil {
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("%s: not done within --timeout %s (last: %s)", what, w.timeout, errorText(err)))
	}
	return err
}
