package e2e

import (
	"net/http"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// TestSnapshotsInS3 keeps snapshots in a real S3-compatible server: the
// golden snapshot and a FULL suspend go there, and the actor resumes from
// it on the other node with its memory and files.
func TestSnapshotsInS3(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", nodes: 2, workersPerNode: 1, s3: true})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	if code, _, body := c.routerGet("c1"); code != http.StatusOK || body != "count=1 lines=1" {
		t.Fatalf("GET / of c1: %d %q, want count=1 lines=1", code, body)
	}
	node := c.actor("c1").GetStatus().GetWorker().GetNode()
	suspended := c.suspend("c1")
	if suspended.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("c1 after suspend: %v", suspended.GetStatus().GetState())
	}
	objects, err := c.objects.List(c.ctx, "default/"+suspended.GetMetadata().GetUid()+"/")
	if err != nil || len(objects) == 0 {
		t.Fatalf("c1's snapshot in S3: %d objects (%v), want its files and manifest", len(objects), err)
	}

	c.holdWorkerOf(node, "counter")
	if code, _, body := c.routerGet("c1"); code != http.StatusOK || body != "count=2 lines=2" {
		t.Fatalf("GET / of c1 after the resume: %d %q, want count=2 lines=2", code, body)
	}
	if moved := c.actor("c1").GetStatus().GetWorker().GetNode(); moved == node {
		t.Fatalf("c1 resumed on node %s again, want the other node", node)
	}
	c.checkReciprocal()
}
