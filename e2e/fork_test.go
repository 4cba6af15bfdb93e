package e2e

import (
	"fmt"
	"io/fs"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// TestForkCounter, on gVisor: a counter at count 5 is forked three times
// (once while it runs, twice from a tag); each fork answers 6 on its first
// request and names itself in /whoami, while the source goes on at 6 on
// its own; the forks restore from the source's snapshot files, not
// copies. Another space forks from a published tag, never from an
// unpublished one. Then the source, running, is reverted to the snapshot
// it was forked at.
func TestForkCounter(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) { testForkCounter(t, backend) })
	}
}

func testForkCounter(t *testing.T, backend string) {
	c := newCluster(t, clusterOptions{backend: backend, workersPerNode: 4})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	for i := 1; i <= 5; i++ {
		c.wantCount("default", "c1", i)
	}

	// While c1 runs: it is checkpointed for the fork and runs on.
	c.fork("default", "f1", &torporv1.ForkSource{Actor: "c1"}, "")
	if st := c.actor("c1").GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("source c1 is %v after the fork, want RUNNING", st)
	}
	five := c.actor("c1").GetStatus().GetLatestSnapshot()
	c.tag("default", "five", five, torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_SPACE)
	stored := storedBytes(t, c.snapshotStorage)
	c.fork("default", "f2", &torporv1.ForkSource{Tag: "five"}, "")
	c.fork("default", "f3", &torporv1.ForkSource{Tag: "default/five"}, "")
	if after := storedBytes(t, c.snapshotStorage); after != stored {
		t.Fatalf("snapshot storage holds %d bytes after two forks, %d before: a fork must not copy", after, stored)
	}

	source := c.snapshot("default", five)
	for _, f := range []string{"f1", "f2", "f3"} {
		if loc := c.snapshot("default", c.actor(f).GetStatus().GetLatestSnapshot()).GetLocation(); loc != source.GetLocation() {
			t.Errorf("fork %s starts from %s, want the source's files %s (no copy)", f, loc, source.GetLocation())
		}
		c.wantCount("default", f, 6)
		c.wantIdentity("default", f)
	}
	c.wantCount("default", "c1", 6)
	c.wantIdentity("default", "c1")
	c.wantCount("default", "f1", 7) // the forks go on apart from each other
	c.wantCount("default", "f2", 7)
	for _, f := range []string{"f1", "f2", "f3"} {
		c.suspend(f)
	}

	// Another space: only from a published tag, onto its own template.
	if _, err := c.store.Spaces().Create(c.ctx, &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: "team"}}); err != nil {
		t.Fatal(err)
	}
	theirs := counterTemplate(t, "counter", nil)
	theirs.Metadata.Space = "team"
	if _, err := c.templates.CreateTemplate(c.ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: theirs})); err != nil {
		t.Fatal(err)
	}
	_, err := c.actors.CreateActor(c.ctx, connect.NewRequest(&torporv1.CreateActorRequest{
		Actor: &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "team", Name: "g1"}, Spec: &torporv1.ActorSpec{Template: "counter"}},
		From:  &torporv1.ForkSource{Tag: "default/five"},
	}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "tag default/five is not published") {
		t.Fatalf("fork into team from an unpublished tag: %v, want FailedPrecondition naming the tag", err)
	}
	c.tag("default", "five-public", five, torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_PUBLISHED)
	c.fork("team", "g1", &torporv1.ForkSource{Tag: "default/five-public"}, "counter")
	c.wantCount("team", "g1", 6)
	c.wantIdentity("team", "g1")

	// Revert of a RUNNING actor: c1 (now at 6, then 7 after a suspend)
	// goes back to the snapshot it was forked at.
	c.suspend("c1")
	c.wantCount("default", "c1", 7)
	reverted, err := c.actors.RevertActor(c.ctx, connect.NewRequest(&torporv1.RevertActorRequest{Space: "default", Name: "c1", Snapshot: five}))
	if err != nil {
		t.Fatal(err)
	}
	if st := reverted.Msg.GetStatus(); st.GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING || st.GetLatestSnapshot() != five {
		t.Fatalf("after the revert: %v, want RUNNING at %s", st, five)
	}
	c.wantCount("default", "c1", 6)
	c.wantEvent("c1", "revert to snapshot "+five+" requested", "1 newer snapshots discarded: the running workload was stopped")
	c.checkReciprocal()
}

// TestRevertCrashed, on gVisor: an actor whose latest snapshot is corrupt
// crashes on its resume (DataLoss); reverting it to the snapshot before
// brings it back RUNNING with that state, and its events say so.
func TestRevertCrashed(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", nodes: 2, workersPerNode: 1})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	c.wantCount("default", "c1", 1)
	c.wantCount("default", "c1", 2)
	earlier := c.suspend("c1").GetStatus().GetLatestSnapshot()
	c.wantCount("default", "c1", 3)
	node := c.actor("c1").GetStatus().GetWorker().GetNode()
	latest := c.suspend("c1").GetStatus().GetLatestSnapshot()
	// The node that took the snapshot would restore it from its cache; the
	// other reads it from storage, where it is corrupted.
	c.holdWorkerOf(node, "counter")
	tamperSnapshot(t, c, latest)
	if _, err := c.resume("c1", nil); connect.CodeOf(err) != connect.CodeDataLoss {
		t.Fatalf("resume from the corrupt snapshot: %v, want DataLoss", err)
	}
	if st := c.actor("c1").GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_CRASHED {
		t.Fatalf("c1 is %v, want CRASHED", st)
	}

	if _, err := c.actors.RevertActor(c.ctx, connect.NewRequest(&torporv1.RevertActorRequest{Space: "default", Name: "c1", Snapshot: earlier})); err != nil {
		t.Fatal(err)
	}
	c.wantCount("default", "c1", 3)
	c.wantEvent("c1", "revert to snapshot "+earlier+"; 1 newer snapshots discarded")
	if _, err := c.snapshots.GetSnapshot(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: latest})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("the discarded snapshot %s: %v, want NotFound", latest, err)
	}
	c.checkReciprocal()
}

// storedBytes is the size of every file under dir.
func storedBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += info.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// wantCount sends one request to actor of space through the router and
// wants the counter's answer to it to be its n-th request, memory and
// volume alike.
func (c *cluster) wantCount(space, actor string, n int) {
	c.t.Helper()
	if code, _, body := c.routerGetIn(space, actor, "/"); code != http.StatusOK || body != fmt.Sprintf("count=%d lines=%d", n, n) {
		c.t.Fatalf("GET / of %s/%s: %d %q, want count=%d lines=%d", space, actor, code, body, n, n)
	}
}

// wantIdentity wants actor to answer /whoami with its own certificate
// and /hostname with its own name.
func (c *cluster) wantIdentity(space, actor string) {
	c.t.Helper()
	want := regexp.MustCompile(`^spiffe://torpor\.local/space/` + space + `/actor/` + actor + ` serial=[0-9a-f]+$`)
	if code, _, body := c.routerGetIn(space, actor, "/whoami"); code != http.StatusOK || !want.MatchString(body) {
		c.t.Fatalf("GET /whoami of %s/%s: %d %q, want %s", space, actor, code, body, want)
	}
	if code, _, body := c.routerGetIn(space, actor, "/hostname"); code != http.StatusOK || body != actor {
		c.t.Fatalf("GET /hostname of %s/%s: %d %q, want %q", space, actor, code, body, actor)
	}
}

func (c *cluster) fork(space, name string, from *torporv1.ForkSource, template string) {
	c.t.Helper()
	resp, err := c.actors.CreateActor(c.ctx, connect.NewRequest(&torporv1.CreateActorRequest{
		Actor: &torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: space, Name: name}, Spec: &torporv1.ActorSpec{Template: template}},
		From:  from,
	}))
	if err != nil {
		c.t.Fatalf("fork %s/%s from %v: %v", space, name, from, err)
	}
	if st := resp.Msg.GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		c.t.Fatalf("fork %s/%s is %v, want SUSPENDED", space, name, st)
	}
}

func (c *cluster) tag(space, tag, snapshot string, scope torporv1.SnapshotTagScope) {
	c.t.Helper()
	if _, err := c.snapshots.TagSnapshot(c.ctx, connect.NewRequest(&torporv1.TagSnapshotRequest{Space: space, Name: tag, Snapshot: snapshot, Scope: scope})); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) snapshot(space, name string) *torporv1.Snapshot {
	c.t.Helper()
	resp, err := c.snapshots.GetSnapshot(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: space, Name: name}))
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.Msg
}

// wantEvent wants each of parts in one of actor's events.
func (c *cluster) wantEvent(actor string, parts ...string) {
	c.t.Helper()
	var reasons []string
	for _, ev := range c.events(actor) {
		reasons = append(reasons, ev.GetReason())
	}
	all := strings.Join(reasons, "\n")
	for _, p := range parts {
		if !strings.Contains(all, p) {
			c.t.Fatalf("events of %s lack %q:\n%s", actor, p, all)
		}
	}
}
