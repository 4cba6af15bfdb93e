package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

const forkHelp = "Fork: --from ACTOR (in the same space) or --from-tag [SPACE/]TAG starts the new\n" +
	"actor from that snapshot's memory and files, with its own identity (certificate,\n" +
	"hostname, /run/torpor/identity/actor.env, which names the source in\n" +
	"TORPOR_FORKED_FROM on its first start). A RUNNING source is suspended for the fork\n" +
	"and resumed. --template defaults to the snapshot's revision; a fork into another\n" +
	"space needs a published tag and --template of that space, which must be\n" +
	"compatible with the snapshot's (the rules of actor update; --allow-state-loss\n" +
	"accepts a named loss). Forks share the snapshot's files: nothing is copied."

// forkFlags are actor create's flags for a fork.
type forkFlags struct {
	actor, tag     string
	allowStateLoss bool
}

func (f *forkFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.actor, "from", "", "fork: start from this actor's latest snapshot (same space)")
	cmd.Flags().StringVar(&f.tag, "from-tag", "", "fork: start from the snapshot of this tag: TAG, or SPACE/TAG (another space's tag must be published)")
	cmd.Flags().BoolVar(&f.allowStateLoss, "allow-state-loss", false, "fork: accept a template that loses some of the snapshot's state (named in the refusal)")
	cmd.MarkFlagsMutuallyExclusive("from", "from-tag")
}

// source is the request's fork source, nil when not forking.
func (f *forkFlags) source() (*torporv1.ForkSource, error) {
	if f.actor == "" && f.tag == "" {
		if f.allowStateLoss {
			return nil, errors.New("--allow-state-loss goes with --from or --from-tag")
		}
		return nil, nil
	}
	return &torporv1.ForkSource{Actor: f.actor, Tag: f.tag}, nil
}

func newActorRevertCommand(a *app) *cobra.Command {
	var to string
	var yes bool
	cmd := &cobra.Command{
		Use:     "revert NAME [--to SNAPSHOT] [--yes]",
		Example: "  torpor actor revert c1\n  torpor actor revert c1 --to s-20260102-030405-ab12 --yes",
		Short:   "Bring an actor back to one of its snapshots, discarding newer state",
		Long: "Bring a RUNNING, PAUSED, CRASHED or SUSPENDED actor back to one of its snapshots\n" +
			"in snapshot storage (default: the latest; torpor snapshot list shows them) and\n" +
			"resume it from there. Newer state is discarded: a running workload is stopped\n" +
			"without a checkpoint, a local checkpoint or a crash is dropped, and the actor's\n" +
			"newer snapshots that no tag keeps are deleted. Asks first unless --yes. The\n" +
			"actor's events record the revert.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes {
				target := "its latest snapshot"
				if to != "" {
					target = "snapshot " + to
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "Revert actor %s/%s to %s, discarding its newer state? [y/N] ", a.space, args[0], target)
				answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
					return errors.New("not reverted (confirm, or pass --yes)")
				}
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			actor, err := call(cmd.Context(), c.actors.RevertActor, &torporv1.RevertActorRequest{Space: a.space, Name: args[0], Snapshot: to})
			if err != nil {
				return err
			}
			return actorKind.printChanged(cmd.OutOrStdout(), a.output, actor, "reverted to snapshot "+actor.GetStatus().GetLatestSnapshot())
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "snapshot to go back to (default: the latest)")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

var tagKind = &kind[*torporv1.SnapshotTag]{
	name:   "tag",
	plural: "tags",
	sample: "before-migration",
	spaced: true,
	columns: []column[*torporv1.SnapshotTag]{
		{"SNAPSHOT", (*torporv1.SnapshotTag).GetSnapshot},
		{"ACTOR", (*torporv1.SnapshotTag).GetActor},
		{"SCOPE", func(t *torporv1.SnapshotTag) string { return enumName(t.GetScope()) }},
	},
	list: func(ctx context.Context, c *clients, req *torporv1.ListRequest) ([]*torporv1.SnapshotTag, string, error) {
		resp, err := call(ctx, c.snapshots.ListSnapshotTags, req)
		return resp.GetTags(), resp.GetNextPageToken(), err
	},
}

// newSnapshotTagCommands are snapshot tag, tags and untag.
func newSnapshotTagCommands(a *app) []*cobra.Command {
	var publish bool
	tag := &cobra.Command{
		Use:     "tag SNAPSHOT NAME [--publish]",
		Example: "  torpor snapshot tag s-20260102-030405-ab12 before-migration\n  torpor snapshot tag s-20260102-030405-ab12 base --publish",
		Short:   "Name a snapshot; retention keeps it until untagged, and actors can be forked from it",
		Long: "Name an actor's snapshot in snapshot storage (torpor snapshot list). A tagged\n" +
			"snapshot is kept by retention, and by deleting its actor, until untagged.\n" +
			"torpor actor create NEW --from-tag NAME forks an actor from it; with --publish,\n" +
			"from any space too (--from-tag SPACE/NAME), by anyone who may create actors there.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			scope := torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_SPACE
			if publish {
				scope = torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_PUBLISHED
			}
			t, err := call(cmd.Context(), c.snapshots.TagSnapshot, &torporv1.TagSnapshotRequest{Space: a.space, Name: args[1], Snapshot: args[0], Scope: scope})
			if err != nil {
				return err
			}
			return tagKind.printChanged(cmd.OutOrStdout(), a.output, t, "created")
		},
	}
	tag.Flags().BoolVar(&publish, "publish", false, "make the tag usable from every space")
	tags := tagKind.listCommand(a)
	tags.Use, tags.Short, tags.Example = "tags", "List snapshot tags", "  torpor snapshot tags\n  torpor snapshot tags -A"
	untag := &cobra.Command{
		Use:     "untag NAME...",
		Example: "  torpor snapshot untag before-migration",
		Short:   "Remove snapshot tags (retention may then collect the snapshots; a deleted actor's go at once)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			c, err := a.clients()
			if err != nil {
				return err
			}
			for _, name := range names {
				if _, err := call(cmd.Context(), c.snapshots.UntagSnapshot, &torporv1.DeleteRequest{Space: a.space, Name: name}); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "tag/%s deleted\n", name)
			}
			return nil
		},
	}
	return []*cobra.Command{tag, tags, untag}
}
