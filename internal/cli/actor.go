package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/validate"
)

var actorKind = &kind[*torporv1.Actor]{
	name:   "actor",
	plural: "actors",
	spaced: true,
	columns: []column[*torporv1.Actor]{
		{"TEMPLATE", func(a *torporv1.Actor) string {
			return validate.RevisionName(a.GetSpec().GetTemplate(), a.GetSpec().GetTemplateRevision())
		}},
		{"STATE", func(a *torporv1.Actor) string { return enumName(a.GetStatus().GetState()) }},
		{"WORKER", func(a *torporv1.Actor) string { return a.GetStatus().GetWorker().GetName() }},
	},
	get: func(ctx context.Context, c *clients, req *torporv1.GetRequest) (*torporv1.Actor, error) {
		return call(ctx, c.actors.GetActor, req)
	},
	list: func(ctx context.Context, c *clients, req *torporv1.ListRequest) ([]*torporv1.Actor, string, error) {
		resp, err := call(ctx, c.actors.ListActors, req)
		return resp.GetActors(), resp.GetNextPageToken(), err
	},
	delete: func(ctx context.Context, c *clients, req *torporv1.DeleteRequest) error {
		_, err := call(ctx, c.actors.DeleteActor, req)
		return err
	},
}

func newActorCommand(a *app) *cobra.Command {
	noun := actorKind.nounCommand(a, "Manage actors")
	noun.AddCommand(
		newActorCreateCommand(a),
		newActorUpdateCommand(a),
		newActorResumeCommand(a),
		newActorCheckpointCommand(a, "suspend", "suspended", "Checkpoint an actor to snapshot storage and free its worker",
			func(c *clients) actorStep { return c.actors.SuspendActor }),
		newActorCheckpointCommand(a, "pause", "paused", "Checkpoint an actor on its node and free its worker (resumes there fastest)",
			func(c *clients) actorStep { return c.actors.PauseActor }),
		newActorEventsCommand(a),
		newActorPortForwardCommand(a),
		newActorCpCommand(a),
		newActorExecCommand(a),
		newActorLogsCommand(a),
		newActorStatsCommand(a),
		newActorRevertCommand(a),
	)
	return noun
}

// templateFlag is a --template NAME[@REV] flag.
type templateFlag struct{ ref string }

// into sets spec's template and revision (0: the latest) from the flag.
func (f templateFlag) into(spec *torporv1.ActorSpec) error {
	name, rev, err := validate.TemplateRef("--template", f.ref)
	if err != nil {
		return err
	}
	spec.Template, spec.TemplateRevision = name, rev
	return nil
}

func newActorCreateCommand(a *app) *cobra.Command {
	var spec torporv1.ActorSpec
	var tf templateFlag
	var wait time.Duration
	var fork forkFlags
	cmd := &cobra.Command{
		Use:   "create NAME (--template TEMPLATE[@REV] | --from ACTOR | --from-tag [SPACE/]TAG)",
		Short: "Create an actor (it starts suspended and resumes on its first request)",
		Long: "Create an actor on a template revision (default: the latest). It stays on that\n" +
			"revision until moved. A revision whose golden build failed is refused; one still\n" +
			"building is accepted, and its actors cold-boot until the golden snapshot is ready\n" +
			"(--wait waits for it instead).\n\n" +
			forkHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, err := fork.source()
			if err != nil {
				return err
			}
			if tf.ref == "" && from == nil {
				return errors.New("give --template, or --from or --from-tag to fork")
			}
			if tf.ref != "" {
				if err := tf.into(&spec); err != nil {
					return err
				}
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			actor, err := call(cmd.Context(), c.actors.CreateActor, &torporv1.CreateActorRequest{Actor: &torporv1.Actor{
				Metadata: &torporv1.ObjectMeta{Space: a.space, Name: args[0]},
				Spec:     &spec,
			}, From: from, AllowStateLoss: fork.allowStateLoss})
			if err != nil {
				return err
			}
			if err := actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, "created"); err != nil {
				return err
			}
			if from != nil {
				return nil // it restores its snapshot, not the golden
			}
			rev := validate.RevisionName(actor.GetSpec().GetTemplate(), actor.GetSpec().GetTemplateRevision())
			t, err := call(cmd.Context(), c.templates.GetTemplate, &torporv1.GetRequest{Space: a.space, Name: rev})
			if err != nil {
				return err
			}
			if phase := t.GetStatus().GetPhase(); phase != torporv1.TemplatePhase_TEMPLATE_PHASE_READY {
				if wait > 0 {
					return waitForGolden(cmd.Context(), cmd.ErrOrStderr(), c, t, wait)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "note: the golden snapshot of template/%s is %s: until it is READY the actor cold-boots on its first resume (--wait waits for it)\n", rev, enumName(phase))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&tf.ref, "template", "", "template in the actor's space: NAME (its latest revision) or NAME@REV; with --from, default: the snapshot's revision")
	cmd.Flags().StringToStringVar(&spec.WorkerSelector, "selector", nil, "labels a worker must carry to host the actor (k=v,...)")
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the revision's golden snapshot, printing its progress")
	cmd.Flags().Lookup("wait").NoOptDefVal = "5m"
	fork.register(cmd)
	return cmd
}

func newActorUpdateCommand(a *app) *cobra.Command {
	var spec torporv1.ActorSpec
	var tf templateFlag
	var allowStateLoss bool
	cmd := &cobra.Command{
		Use:   "update NAME [--selector k=v,...] [--template TEMPLATE[@REV] [--allow-state-loss]]",
		Short: "Change an actor's worker selector or template revision",
		Long: "Change an actor's worker selector or template revision (TEMPLATE alone: its\n" +
			"latest). Only the fields given are sent. The template can change only while the\n" +
			"actor is suspended or crashed. The next resume discards the actor's process\n" +
			"memory and keeps its durable volumes. A move that would lose more is refused,\n" +
			"naming what: a volume of the actor's snapshot missing or mounted elsewhere, or a\n" +
			"snapshot without durable data (all state is memory). --allow-state-loss accepts\n" +
			"that loss; it is recorded in the actor's events. Another sandbox class is refused.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var mask fieldmaskpb.FieldMask
			for _, f := range []struct{ flag, path string }{{"selector", "spec.worker_selector"}, {"template", "spec.template"}} {
				if cmd.Flags().Changed(f.flag) {
					mask.Paths = append(mask.Paths, f.path)
				}
			}
			if len(mask.Paths) == 0 {
				return errors.New("nothing to update: give --selector or --template")
			}
			if cmd.Flags().Changed("template") {
				if err := tf.into(&spec); err != nil {
					return err
				}
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			actor, err := call(cmd.Context(), c.actors.UpdateActor, &torporv1.UpdateActorRequest{
				Actor: &torporv1.Actor{
					Metadata: &torporv1.ObjectMeta{Space: a.space, Name: args[0]},
					Spec:     &spec,
				},
				UpdateMask:     &mask,
				AllowStateLoss: allowStateLoss,
			})
			if err != nil {
				return err
			}
			return actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, "updated")
		},
	}
	cmd.Flags().StringToStringVar(&spec.WorkerSelector, "selector", nil, "labels a worker must carry (k=v,...); an empty value clears them")
	cmd.Flags().StringVar(&tf.ref, "template", "", "template revision to move the actor to: NAME (its latest) or NAME@REV")
	cmd.Flags().BoolVar(&allowStateLoss, "allow-state-loss", false, "accept a move that loses state (named in the refusal)")
	return cmd
}

func newActorResumeCommand(a *app) *cobra.Command {
	var req torporv1.ResumeActorRequest
	cmd := &cobra.Command{
		Use:   "resume NAME",
		Short: "Bring an actor to RUNNING on a free worker (normally the router does this on demand)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			req.Space, req.Name = a.space, args[0]
			actor, err := call(cmd.Context(), c.actors.ResumeActor, &req)
			if err != nil {
				return err
			}
			return actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, "resumed")
		},
	}
	cmd.Flags().BoolVar(&req.Boot, "boot", false, "cold-boot an actor that has no state instead of restoring the golden snapshot")
	cmd.Flags().StringVar(&req.Snapshot, "snapshot", "", "restore this kept snapshot instead of the latest")
	cmd.Flags().BoolVar(&req.AllowStateLoss, "allow-state-loss", false, "accept restoring a snapshot taken under another template revision that loses state (named in the refusal)")
	return cmd
}

// actorStep is an RPC that moves one actor, named by a GetRequest.
type actorStep func(context.Context, *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error)

func newActorCheckpointCommand(a *app, verb, past, short string, rpc func(*clients) actorStep) *cobra.Command {
	return &cobra.Command{
		Use:   verb + " NAME",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			actor, err := call(cmd.Context(), rpc(c), &torporv1.GetRequest{Space: a.space, Name: args[0]})
			if err != nil {
				return err
			}
			return actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, past)
		},
	}
}

func newActorEventsCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "events NAME",
		Short: "Show an actor's state history",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), c.actors.ListActorEvents, &torporv1.GetRequest{Space: a.space, Name: args[0]})
			if err != nil {
				return err
			}
			if a.output != formatTable {
				return printMessages(cmd.OutOrStdout(), a.output, []proto.Message{resp}, false)
			}
			if len(resp.GetEvents()) == 0 {
				_, err := fmt.Fprintln(cmd.ErrOrStderr(), "No events found.")
				return err
			}
			rows := make([][]string, len(resp.GetEvents()))
			for i, e := range resp.GetEvents() {
				var took string
				if e.GetDurationMs() > 0 {
					took = (time.Duration(e.GetDurationMs()) * time.Millisecond).String()
				}
				rows[i] = []string{
					e.GetTime().AsTime().Local().Format(time.DateTime),
					enumName(e.GetFromState()),
					enumName(e.GetToState()),
					e.GetWorker(),
					took,
					e.GetReason(),
				}
			}
			return printTable(cmd.OutOrStdout(), []string{"TIME", "FROM", "TO", "WORKER", "TOOK", "REASON"}, rows)
		},
	}
}
