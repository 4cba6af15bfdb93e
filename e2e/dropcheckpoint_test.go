package e2e

import (
	"io/fs"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// TestDeletePausedActorLeavesNoCheckpoint: a paused actor's checkpoint is
// kept on its node; deleting the actor removes it there, chunks and all.
func TestDeletePausedActorLeavesNoCheckpoint(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	running := c.mustResume("c1")
	if got := get(t, running); got != "count=1 lines=1" {
		t.Fatalf("first request: %q", got)
	}
	paused := c.pause("c1")
	if paused.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_PAUSED {
		t.Fatalf("after pause: %v", paused.GetStatus())
	}
	local := filepath.Join(c.nodes[0].state, "local-trees")
	// files are the regular files under local-trees/ (its checkpoints;
	// only c1 ever paused on this node).
	files := func() []string {
		var found []string
		err := filepath.WalkDir(local, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				found = append(found, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return found
	}
	if len(files()) == 0 {
		t.Fatalf("no local checkpoint under %s after the pause: the test proves nothing", local)
	}

	if _, err := c.actors.DeleteActor(c.ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: "default", Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	var left []string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("left under %s: %v", local, left)
		}
	})
	c.waitFor("the node to drop the deleted actor's checkpoint", func() bool {
		left = files()
		return len(left) == 0
	})
}
