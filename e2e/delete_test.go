package e2e

import (
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// nothingLeftOf fails when the node still holds anything of actor uid
// that ran on worker: a sandbox there, a file or directory named by its
// uid in the node's state (volumes, log, checkpoints, stage; not the
// operation journal), a mount or
// a process naming it.
func (c *cluster) nothingLeftOf(n *nodeAgent, worker, uid string) {
	c.t.Helper()
	if st, err := n.runtime.Stats(c.ctx, runtime.Slot{Name: worker}); err != nil || st.Running {
		c.t.Errorf("worker %s: a workload still runs (%v)", worker, err)
	}
	filepath.WalkDir(n.state, func(path string, d fs.DirEntry, err error) error {
		// The operation journal keeps outcomes for the control plane's
		// retries of them, the delete's own too, pruned after a day.
		if err == nil && d.IsDir() && path == filepath.Join(n.state, "ops") {
			return filepath.SkipDir
		}
		if err == nil && strings.Contains(d.Name(), uid) {
			c.t.Errorf("node %s keeps %s of deleted actor %s", n.name, path, uid)
		}
		return nil
	})
	for _, m := range runtimetest.MountsUnder(c.t, n.state) {
		if strings.Contains(m, uid) {
			c.t.Errorf("node %s: mount %s of deleted actor %s", n.name, m, uid)
		}
	}
	for _, p := range processesMentioning(c.t, uid) {
		c.t.Errorf("process of deleted actor %s: %s", uid, p)
	}
}

// TestForceDeleteAndCascade: `actor delete --force` deletes a running
// actor in one call, with no snapshot written and nothing of it left on
// its node; `space delete --cascade` deletes a space with its running,
// paused and suspended actors and its templates.
func TestForceDeleteAndCascade(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 3})
	image := buildShellImage(t, t.TempDir())
	c.applyTemplate(lineWriter(image))
	admin := c.conn.Token
	cli := func(args ...string) (string, error) {
		out, err := c.torporAs(admin, args...).CombinedOutput()
		return string(out), err
	}
	node := c.nodes[0]

	c.createActor("f1", "lines")
	a := c.mustResume("f1")
	c.waitFor("f1 writing", func() bool {
		out, _ := cli("actor", "logs", "f1")
		return strings.Contains(out, " writer line ")
	})
	if out, err := cli("actor", "delete", "f1"); err == nil || !strings.Contains(out, "with force") {
		t.Fatalf("delete of a running actor without --force: %v\n%s\nwant a refusal naming force", err, out)
	}
	if got := c.actor("f1").GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("a refused delete left f1 %s", got)
	}
	if out, err := cli("actor", "delete", "f1", "--force"); err != nil || !strings.Contains(out, "actor/f1 deleted") {
		t.Fatalf("delete --force of running f1: %v\n%s", err, out)
	}
	if _, err := c.actors.GetActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "f1"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("f1 after delete --force: %v, want not found", err)
	}
	snaps, err := c.snapshots.ListSnapshots(c.ctx, connect.NewRequest(&torporv1.ListRequest{Space: "default"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps.Msg.GetSnapshots() {
		if s.GetActorUid() == a.GetMetadata().GetUid() {
			t.Errorf("snapshot %s of f1 after delete --force", s.GetMetadata().GetName())
		}
	}
	c.nothingLeftOf(node, a.GetStatus().GetWorker().GetName(), a.GetMetadata().GetUid())

	// A space with a running, a paused and a suspended actor.
	if _, err := torporv1connect.NewSpaceServiceClient(c.http, c.api).CreateSpace(c.ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{
		Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: "tenant"}},
	})); err != nil {
		t.Fatal(err)
	}
	tmpl := lineWriter(image)
	tmpl.Metadata.Space = "tenant"
	if _, err := c.templates.CreateTemplate(c.ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tmpl})); err != nil {
		t.Fatal(err)
	}
	c.waitFor("tenant's golden snapshot", func() bool {
		resp, err := c.templates.GetTemplate(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "tenant", Name: "lines"}))
		return err == nil && resp.Msg.GetStatus().GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_READY
	})
	ran := map[string]*torporv1.Actor{}
	for _, name := range []string{"running", "paused", "suspended"} {
		if _, err := c.actors.CreateActor(c.ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
			Metadata: &torporv1.ObjectMeta{Space: "tenant", Name: name}, Spec: &torporv1.ActorSpec{Template: "lines"},
		}})); err != nil {
			t.Fatal(err)
		}
		resp, err := c.actors.ResumeActor(c.ctx, connect.NewRequest(&torporv1.ResumeActorRequest{Space: "tenant", Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		ran[name] = resp.Msg
	}
	if _, err := c.actors.PauseActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "tenant", Name: "paused"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.actors.SuspendActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "tenant", Name: "suspended"})); err != nil {
		t.Fatal(err)
	}
	if out, err := cli("space", "delete", "tenant"); err == nil || !strings.Contains(out, "not empty") {
		t.Fatalf("delete of a space with actors: %v\n%s\nwant a refusal", err, out)
	}
	if out, err := cli("space", "delete", "tenant", "--cascade"); err != nil || !strings.Contains(out, "space/tenant deleted") {
		t.Fatalf("space delete --cascade: %v\n%s", err, out)
	}
	for name, a := range ran {
		if _, err := c.actors.GetActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "tenant", Name: name})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("actor tenant/%s after the cascade: %v, want not found", name, err)
		}
		c.nothingLeftOf(node, a.GetStatus().GetWorker().GetName(), a.GetMetadata().GetUid())
	}
	if _, err := c.templates.GetTemplate(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "tenant", Name: "lines"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("template tenant/lines after the cascade: %v, want not found", err)
	}
}
