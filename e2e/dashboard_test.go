package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// TestDashboardForTenant: the dashboard in headless Chromium with a token
// of one space: it lists that space's actors (their template as `actor
// list` shows it, after a rollout too), templates with their phase and a
// failed build's error, snapshots and tags, an actor's events and log
// newest first, and its actions resume, suspend, fork and delete work.
// Screenshots go to the test's artifact directory.
func TestDashboardForTenant(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	image := buildShellImage(t, t.TempDir())
	c.applyTemplate(lineWriter(image))
	broken := &torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "broken"}, Spec: &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers:   []*torporv1.Container{{Name: "app", Image: image, Command: []string{"/bin/false"}}},
	}}
	if _, err := c.templates.CreateTemplate(c.ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: broken})); err != nil {
		t.Fatal(err)
	}
	c.waitFor("broken's build to fail", func() bool {
		resp, err := c.templates.GetTemplate(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "broken"}))
		return err == nil && resp.Msg.GetStatus().GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED
	})
	c.createActor("a1", "lines")
	c.mustResume("a1")
	c.waitFor("a1's lines", func() bool {
		out, _ := c.torporAs(c.conn.Token, "actor", "logs", "a1").Output()
		return strings.Contains(string(out), " writer line 3")
	})
	c.suspend("a1")
	snaps, err := c.snapshots.ListSnapshots(c.ctx, connect.NewRequest(&torporv1.ListRequest{Space: "default"}))
	if err != nil {
		t.Fatal(err)
	}
	var a1Snap string
	for _, s := range snaps.Msg.GetSnapshots() {
		if s.GetActorName() == "a1" {
			a1Snap = s.GetMetadata().GetName()
		}
	}
	if _, err := c.snapshots.TagSnapshot(c.ctx, connect.NewRequest(&torporv1.TagSnapshotRequest{Space: "default", Name: "before-rollout", Snapshot: a1Snap})); err != nil {
		t.Fatal(err)
	}
	// A second revision, and a1 rolled out to it.
	next := lineWriter(image)
	next.Spec.Containers[0].Env = []*torporv1.EnvVar{{Name: "REVISION", Value: "2"}}
	c.applyTemplate(next)
	if _, err := c.templates.RolloutTemplate(c.ctx, connect.NewRequest(&torporv1.RolloutTemplateRequest{Space: "default", Name: "lines"})); err != nil {
		t.Fatal(err)
	}
	token := c.apiToken("default")
	list, err := c.torporAs(token, "actor", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var listed string // a1's TEMPLATE column
	for _, l := range strings.Split(string(list), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "a1" {
			listed = f[1]
		}
	}
	if listed != "lines@2" {
		t.Fatalf("actor list after the rollout:\n%s\nwant a1 on lines@2", list)
	}

	// Generous: on a loaded 2-core machine Chromium and the golden builds
	// share the cores (a bound, not a speed check).
	ctx := browser(t, 1280, 1400, 6*time.Minute)
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.ArtifactDir(), name+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	actorRow := `tr[data-actor="default/a1"]`
	signIn(ctx, t, c.api+"/dashboard/", token)
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS(actorRow)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-template="default/broken"]`)),
	); err != nil {
		t.Fatalf("dashboard with a token of space default: %v", err)
	}
	if got := text(actorRow + " td.template"); got != listed {
		t.Errorf("the dashboard's template of a1 is %q, actor list's %q", got, listed)
	}
	if got := text(`tr[data-template="default/broken"]`); !strings.Contains(got, "FAILED") || !strings.Contains(got, "exit") {
		t.Errorf("the failed template's row: %q, want FAILED with its error", got)
	}
	if got := text("#snapshots tbody"); !strings.Contains(got, a1Snap) || !strings.Contains(got, "before-rollout") {
		t.Errorf("snapshots: %q, want a1's snapshot %s tagged before-rollout", got, a1Snap)
	}
	if got := text("#nodes-note"); got == "" {
		t.Error("no note says why a tenant sees no nodes")
	}
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(actorRow)),
		chromedp.WaitVisible(chromedp.CSS("#events li")),
	); err != nil {
		t.Fatalf("a1's events: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("logs").textContent.includes("writer line")`, chromedp.WithPollingTimeout(time.Minute))); err != nil {
		t.Fatalf("a1's log: %v (%q)", err, text("#logs"))
	}
	first, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[document.querySelector("#events li").textContent, document.getElementById("logs").textContent]`))
	if err != nil {
		t.Fatal(err)
	}
	events, logs := first[0], first[1]
	if !strings.Contains(events, "lines@2") {
		t.Errorf("the newest event shown first is %q, want the rollout's move to lines@2", events)
	}
	if first := strings.SplitN(logs, "\n", 2)[0]; !strings.Contains(first, " -- suspended") {
		t.Errorf("the newest log line shown first is %q, want the suspend", first)
	}
	if got := c.actor("a1").GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("showing a1's log made it %s", got)
	}
	shot("dashboard-tenant")

	// Actions.
	click := func(row, action string) {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`%s button[data-action=%q]`, row, action)))); err != nil {
			t.Fatalf("%s of %s: %v", action, row, err)
		}
	}
	waitState := func(name string, want torporv1.ActorState) {
		t.Helper()
		c.waitFor(name+" "+want.String(), func() bool { return c.actor(name).GetStatus().GetState() == want })
	}
	click(actorRow, "resume")
	waitState("a1", torporv1.ActorState_ACTOR_STATE_RUNNING)
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(actorRow+` button[data-action="suspend"]`))); err != nil {
		t.Fatal(err)
	}
	click(actorRow, "suspend")
	waitState("a1", torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(actorRow+` button[data-action="resume"]`))); err != nil {
		t.Fatal(err)
	}
	click(actorRow, "fork")
	forkRow := `tr[data-actor^="default/a1-fork-"]`
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(forkRow))); err != nil {
		t.Fatalf("the fork's row: %v (%s)", err, text("#action-result"))
	}
	shot("dashboard-forked")
	click(forkRow, "delete")
	click(forkRow, "confirm delete")
	if err := chromedp.Do(ctx, chromedp.WaitNotPresent(chromedp.CSS(forkRow))); err != nil {
		t.Fatalf("the deleted fork's row stays: %v (%s)", err, text("#action-result"))
	}
	resp, err := c.actors.ListActors(c.ctx, connect.NewRequest(&torporv1.ListRequest{Space: "default"}))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.Msg.GetActors()); n != 1 {
		t.Errorf("%d actors after fork and delete, want a1 alone", n)
	}
}
