package cli

import (
	"context"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

var snapshotKind = &kind[*torporv1.Snapshot]{
	name:   "snapshot",
	plural: "snapshots",
	sample: "s-20260102-030405-ab12",
	spaced: true,
	columns: []column[*torporv1.Snapshot]{
		{"KIND", snapshotKindOf},
		{"ACTOR", (*torporv1.Snapshot).GetActorName},
		{"SCOPE", func(s *torporv1.Snapshot) string { return enumName(s.GetScope()) }},
		{"TEMPLATE", (*torporv1.Snapshot).GetTemplateName},
		{"SIZE", func(s *torporv1.Snapshot) string { return humanize.IBytes(uint64(max(s.GetSizeBytes(), 0))) }},
		{"NODE", (*torporv1.Snapshot).GetNode},
	},
	wide: []column[*torporv1.Snapshot]{
		{"ORIGIN", (*torporv1.Snapshot).GetOriginNode},
		{"FORKED FROM", (*torporv1.Snapshot).GetForkedFrom},
	},
	get: func(ctx context.Context, c *clients, req *torporv1.GetRequest) (*torporv1.Snapshot, error) {
		return call(ctx, c.snapshots.GetSnapshot, req)
	},
	list: func(ctx context.Context, c *clients, req *torporv1.ListRequest) ([]*torporv1.Snapshot, string, error) {
		resp, err := call(ctx, c.snapshots.ListSnapshots, req)
		return resp.GetSnapshots(), resp.GetNextPageToken(), err
	},
	delete: func(ctx context.Context, c *clients, req *torporv1.DeleteRequest) error {
		_, err := call(ctx, c.snapshots.DeleteSnapshot, req)
		return err
	},
}

// snapshotKindOf tells a template revision's golden snapshot, which its
// golden build writes under the revision's own uid, from an actor's.
func snapshotKindOf(s *torporv1.Snapshot) string {
	if s.GetActorUid() != "" && s.GetActorUid() == s.GetTemplateUid() {
		return "golden"
	}
	return "actor"
}

// Snapshots are written by checkpoints only, so there is no create.
func newSnapshotCommand(a *app) *cobra.Command {
	noun := snapshotKind.nounCommand(a, "Inspect, tag and delete snapshots")
	noun.AddCommand(newSnapshotTagCommands(a)...)
	return noun
}
