package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/validate"
)

var actorKind = &kind[*torporv1.Actor]{
	name:   "actor",
	plural: "actors",
	sample: "c1",
	spaced: true,
	columns: []column[*torporv1.Actor]{
		{"TEMPLATE", func(a *torporv1.Actor) string {
			return validate.RevisionName(a.GetSpec().GetTemplate(), a.GetSpec().GetTemplateRevision())
		}},
		{"STATE", actorState},
		{"WORKER", func(a *torporv1.Actor) string { return a.GetStatus().GetWorker().GetName() }},
	},
	wide: []column[*torporv1.Actor]{
		{"SNAPSHOT", func(a *torporv1.Actor) string { return a.GetStatus().GetLatestSnapshot() }},
		{"SELECTOR", func(a *torporv1.Actor) string { return formatLabels(a.GetSpec().GetWorkerSelector()) }},
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
	deleteFlag: &deleteFlag{
		name:  "force",
		usage: "delete a running (or resuming, suspending, pausing) actor too: its workload is stopped without a snapshot, its state since the latest one lost",
		set:   func(req *torporv1.DeleteRequest) { req.Force = true },
	},
	describeMore: describeActor,
}

// actorState is an actor's state as a table shows it: with, for one its
// workload's exit crashed, how it ended and its restart, as kubectl
// shows a CrashLoopBackOff ("CRASHED (exit 1, restart 3 in 4s)"); for a
// frozen one, since when ("RUNNING (frozen 2m)").
func actorState(a *torporv1.Actor) string {
	st := a.GetStatus()
	state := enumName(st.GetState())
	if f := st.GetFrozenTime(); f != nil {
		return fmt.Sprintf("%s (frozen %s)", state, max(time.Since(f.AsTime()), 0).Round(time.Second))
	}
	exit := st.GetExit()
	if exit == nil {
		return state
	}
	how := fmt.Sprintf("exit %d", exit.GetExitCode())
	switch {
	case exit.GetStatusUnknown():
		how = "exited"
	case exit.GetSignal() != "":
		how = exit.GetSignal()
	}
	if next := st.GetNextRestartTime(); next != nil {
		return fmt.Sprintf("%s (%s, restart %d in %s)", state, how, st.GetRestarts(), max(time.Until(next.AsTime()), 0).Round(time.Second))
	}
	return fmt.Sprintf("%s (%s, not restarted)", state, how)
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
		newActorWaitCommand(a),
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
	var wait waitFlags
	var labels map[string]string
	var fork forkFlags
	cmd := &cobra.Command{
		Use:     "create NAME (--template TEMPLATE[@REV] | --from ACTOR | --from-tag [SPACE/]TAG)",
		Example: "  torpor actor create c1 --template counter\n  torpor actor create c2 --template counter@3 -l team=a\n  torpor actor create c1-copy --from c1",
		Short:   "Create an actor (it starts suspended and resumes on its first request)",
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
				Metadata: &torporv1.ObjectMeta{Space: a.space, Name: args[0], Labels: labels},
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
				if wait.on {
					return waitForGolden(cmd.Context(), cmd.ErrOrStderr(), c, t, wait.timeout)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "note: the golden snapshot of template/%s is %s: until it is READY the actor cold-boots on its first resume (--wait waits for it)\n", rev, enumName(phase))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&tf.ref, "template", "", "template in the actor's space: NAME (its latest revision) or NAME@REV; with --from, default: the snapshot's revision")
	cmd.Flags().StringToStringVar(&spec.WorkerSelector, "selector", nil, "labels a worker must carry to host the actor (k=v,...)")
	cmd.Flags().StringToStringVarP(&labels, "labels", "l", nil, "the actor's labels (k=v,...; list -l selects by them)")
	wait.register(cmd, "the revision's golden snapshot is ready, printing its progress")
	fork.register(cmd)
	return cmd
}

func newActorUpdateCommand(a *app) *cobra.Command {
	var spec torporv1.ActorSpec
	var tf templateFlag
	var allowStateLoss bool
	cmd := &cobra.Command{
		Use:     "update NAME [--selector k=v,...] [--template TEMPLATE[@REV] [--allow-state-loss]]",
		Example: "  torpor actor update c1 --template counter@4\n  torpor actor update c1 --selector gpu=true",
		Short:   "Change an actor's worker selector or template revision",
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

// recentEvents is how many of an actor's latest events describe shows.
const recentEvents = 10

// describeActor adds to an actor's record where it is reached and its
// latest events, oldest first as the history reads, as kubectl describe
// ends with a pod's events. It reads the store only: nothing wakes.
func describeActor(ctx context.Context, c *clients, w io.Writer, a *torporv1.Actor, now time.Time) error {
	fmt.Fprintf(w, "URL:  %s\n", actorURL(c.router, c.domain, a.GetMetadata().GetSpace(), a.GetMetadata().GetName()))
	fmt.Fprintf(w, "Egress:  %s\n", effectiveEgress(ctx, c, a))
	resp, err := call(ctx, c.actors.ListActorEvents, &torporv1.GetRequest{Space: a.GetMetadata().GetSpace(), Name: a.GetMetadata().GetName()})
	if err != nil {
		return fmt.Errorf("events of actor %s: %w", a.GetMetadata().GetName(), err)
	}
	events := resp.GetEvents()
	if len(events) == 0 {
		fmt.Fprintln(w, "Events:  <none>")
		return nil
	}
	fmt.Fprintln(w, "Events:")
	var table strings.Builder
	if err := printTable(&table, eventHeaders, eventRows(events[max(0, len(events)-recentEvents):])); err != nil {
		return err
	}
	for _, line := range strings.SplitAfter(strings.TrimSuffix(table.String(), "\n"), "\n") {
		fmt.Fprint(w, "  "+strings.TrimRight(line, " \n")+"\n")
	}
	return nil
}

// actorURL is where the router serves an actor: its host name
// <actor>.<space>.<domain> on the router's scheme and port.
func actorURL(routerURL, domain, space, name string) string {
	host := name + "." + space + "." + domain
	u, err := url.Parse(routerURL)
	if err != nil || u.Host == "" {
		return "http://" + host + "/"
	}
	if port := u.Port(); port != "" {
		host = net.JoinHostPort(host, port)
	}
	return u.Scheme + "://" + host + "/"
}
