package server

import (
	"context"
	"io"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// TestSnapshotTagsAPI: a tag keeps its snapshot from deletes through the
// API and keeps its space from being deleted; untagged, both go. The
// orphan sweep keeps files while any record, a fork's included, names
// them.
func TestSnapshotTagsAPI(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, "sqlite:"+filepath.Join(t.TempDir(), "t.db"), io.Discard)
	c := r.clients(r.admin(t))
	if _, err := c.spaces.CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: "team"}}})); err != nil {
		t.Fatal(err)
	}
	// Records as a checkpoint and a fork write them: s1 in team, and a
	// fork's record in default naming s1's files.
	for _, s := range []*torporv1.Snapshot{
		{Metadata: &torporv1.ObjectMeta{Space: "team", Name: "s1"}, ActorUid: "uid-a", ActorName: "a", Location: "team/uid-a/s1", ManifestDigest: "sha256:x"},
		{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "s2"}, ActorUid: "uid-f", ActorName: "f", Location: "team/uid-a/s1", ManifestDigest: "sha256:x", ForkedFrom: "team/s1"},
		{Metadata: &torporv1.ObjectMeta{Space: "team", Name: "local"}, ActorUid: "uid-a", ActorName: "a", Location: "team/uid-a/local", Node: "n1"},
	} {
		if _, err := r.store.Snapshots().Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}

	tag := func(name, snapshot string) error {
		_, err := c.snapshots.TagSnapshot(ctx, connect.NewRequest(&torporv1.TagSnapshotRequest{Space: "team", Name: name, Snapshot: snapshot, Scope: torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_PUBLISHED}))
		return err
	}
	if err := tag("v1", "s1"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, tag("v1", "s1"), connect.CodeAlreadyExists, "v1")
	wantCode(t, tag("v2", "local"), connect.CodeFailedPrecondition, "local checkpoint on node n1")
	wantCode(t, tag("v2", "nope"), connect.CodeNotFound, "nope")
	wantCode(t, tag("Bad_Name", "s1"), connect.CodeInvalidArgument, "name")
	tags, err := c.snapshots.ListSnapshotTags(ctx, connect.NewRequest(&torporv1.ListRequest{Space: "team"}))
	if err != nil || len(tags.Msg.GetTags()) != 1 || tags.Msg.GetTags()[0].GetActor() != "a" || tags.Msg.GetTags()[0].GetSnapshot() != "s1" {
		t.Fatalf("tags of team: %v %v", tags, err)
	}

	del := func(space, name string) error {
		_, err := c.snapshots.DeleteSnapshot(ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: space, Name: name}))
		return err
	}
	wantCode(t, del("team", "s1"), connect.CodeFailedPrecondition, "tagged v1")
	if err := r.store.Snapshots().Delete(ctx, "team", "local", "", 0); err != nil {
		t.Fatal(err)
	}
	_, err = c.spaces.DeleteSpace(ctx, connect.NewRequest(&torporv1.DeleteRequest{Name: "team"}))
	wantCode(t, err, connect.CodeFailedPrecondition, "snapshot tags (v1)")

	if _, err := c.snapshots.UntagSnapshot(ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: "team", Name: "v1"})); err != nil {
		t.Fatal(err)
	}
	referenced := func(want bool) {
		t.Helper()
		if got, err := r.server.Engine().LocationReferenced(ctx, "team/uid-a/s1"); err != nil || got != want {
			t.Fatalf("location team/uid-a/s1 referenced: %v %v, want %v", got, err, want)
		}
	}
	// Untagged, the snapshot of an actor that does not exist went at
	// once; the fork's record still names the files.
	if _, err := r.store.Snapshots().Get(ctx, "team", "s1"); err == nil {
		t.Fatal("the untagged snapshot of a missing actor is still there")
	}
	referenced(true)
	if err := del("default", "s2"); err != nil {
		t.Fatal(err)
	}
	referenced(false)
	if _, err := c.spaces.DeleteSpace(ctx, connect.NewRequest(&torporv1.DeleteRequest{Name: "team"})); err != nil {
		t.Fatal(err)
	}
}

// TestForkAndRevertRequests: requests the engine cannot act on are
// refused at the edge, naming the field.
func TestForkAndRevertRequests(t *testing.T) {
	ctx := context.Background()
	c := startServer(t, filepath.Join(t.TempDir(), "t.db"))
	create := func(from *torporv1.ForkSource) error {
		_, err := c.actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{
			Actor: &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "f1"}}, From: from,
		}))
		return err
	}
	wantCode(t, create(&torporv1.ForkSource{}), connect.CodeInvalidArgument, "from")
	wantCode(t, create(&torporv1.ForkSource{Actor: "a", Tag: "t"}), connect.CodeInvalidArgument, "from")
	wantCode(t, create(&torporv1.ForkSource{Tag: "x/y/z"}), connect.CodeInvalidArgument, "from.tag")
	wantCode(t, create(&torporv1.ForkSource{Actor: "missing"}), connect.CodeNotFound, "default/missing")
	_, err := c.actors.RevertActor(ctx, connect.NewRequest(&torporv1.RevertActorRequest{Space: "default", Name: "missing"}))
	wantCode(t, err, connect.CodeNotFound, "missing")
}
