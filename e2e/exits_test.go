package e2e

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// shellTemplate runs script in container app of the shell image, with
// change applied to its spec.
func shellTemplate(name, image, script string, change func(*torporv1.TemplateSpec)) *torporv1.Template {
	spec := &torporv1.TemplateSpec{SandboxClass: "gvisor", Containers: []*torporv1.Container{{
		Name: "app", Image: image, Command: []string{"/bin/sh", "-c", script},
	}}}
	if change != nil {
		change(spec)
	}
	return &torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: name}, Spec: spec}
}

// lastEventTo is the newest of actor's events that entered state.
func (c *cluster) lastEventTo(actor string, state torporv1.ActorState) *torporv1.ActorEvent {
	var last *torporv1.ActorEvent
	for _, ev := range c.events(actor) {
		if ev.GetToState() == state {
			last = ev
		}
	}
	return last
}

// crashes counts actor's events into CRASHED.
func (c *cluster) crashes(actor string) int {
	n := 0
	for _, ev := range c.events(actor) {
		if ev.GetToState() == torporv1.ActorState_ACTOR_STATE_CRASHED {
			n++
		}
	}
	return n
}

// TestWorkloadExits: a workload whose process exits is noticed at once
// (DESIGN invariant 11). The actor leaves RUNNING with an event naming
// the container, the status and the last output; its worker is freed;
// the template's restartPolicy restarts it after a back-off that grows
// and shows, or leaves it CRASHED; the router answers at once naming the
// exit. Golden builds report an exit and a port nothing listens on.
func TestWorkloadExits(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	image := buildShellImage(t, t.TempDir())

	t.Run("never", func(t *testing.T) {
		c.applyTemplate(shellTemplate("once", image, `echo starting; sleep 2; echo "fatal: gone for good" >&2; exit 7`, func(s *torporv1.TemplateSpec) {
			s.RestartPolicy = torporv1.RestartPolicy_RESTART_POLICY_NEVER
		}))
		c.createActor("n1", "once")
		running := c.mustResume("n1")
		worker := running.GetStatus().GetWorker()
		var crashed *torporv1.Actor
		c.waitFor("n1 to leave RUNNING after its exit", func() bool {
			crashed = c.actor("n1")
			return crashed.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING
		})
		st := crashed.GetStatus()
		if st.GetState() != torporv1.ActorState_ACTOR_STATE_CRASHED {
			t.Fatalf("n1 is %s after its exit, want CRASHED", st.GetState())
		}
		exit := st.GetExit()
		if exit.GetContainer() != "app" || exit.GetExitCode() != 7 || !slices.Contains(exit.GetLastOutput(), "fatal: gone for good") {
			t.Fatalf("n1's exit is %v, want container app, status 7 and its last line", exit)
		}
		ev := c.lastEventTo("n1", torporv1.ActorState_ACTOR_STATE_CRASHED)
		for _, want := range []string{"container app exited with status 7", "fatal: gone for good", "not restarted (restartPolicy NEVER)"} {
			if !strings.Contains(ev.GetReason(), want) {
				t.Errorf("CRASHED event reason %q does not say %q", ev.GetReason(), want)
			}
		}
		if lag := ev.GetTime().AsTime().Sub(exit.GetTime().AsTime()); lag > 2*time.Second {
			t.Errorf("the exit was recorded %s after the node saw it, want within 2s", lag)
		}
		if st.GetWorker() != nil || st.GetNextRestartTime() != nil {
			t.Errorf("CRASHED n1 keeps worker %v, next restart %v", st.GetWorker(), st.GetNextRestartTime())
		}
		w, err := c.workers.GetWorker(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: worker.GetNamespace(), Name: worker.GetName()}))
		if err != nil {
			t.Fatal(err)
		}
		if w.Msg.GetStatus().GetActor() != nil {
			t.Errorf("worker %s still hosts %v after n1 exited", worker.GetName(), w.Msg.GetStatus().GetActor())
		}

		status, _, body := c.routerGet("n1")
		if status != http.StatusBadGateway || !strings.Contains(body, "actor default/n1: container app exited with status 7 and is not restarted (restartPolicy NEVER)") {
			t.Errorf("router: %d %q, want 502 naming the exit", status, body)
		}
		if strings.Contains(body, "fatal") {
			t.Errorf("router answer %q shows the workload's output to anyone", body)
		}
		// Neither time nor traffic restarts it.
		time.Sleep(2 * time.Second)
		if a := c.actor("n1"); a.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_CRASHED || c.crashes("n1") != 1 {
			t.Errorf("n1 is %s with %d crashes, want it left CRASHED once", a.GetStatus().GetState(), c.crashes("n1"))
		}
	})

	t.Run("always, with a growing back-off", func(t *testing.T) {
		c.applyTemplate(shellTemplate("flaky", image, `echo starting; sleep 3; echo "fatal: boom" >&2; exit 1`, nil))
		c.createActor("f1", "flaky")
		c.mustResume("f1")
		var delays []string
		for restart := 1; restart <= 2; restart++ {
			var crashed *torporv1.Actor
			c.waitFor("f1 to crash for exit "+strconv.Itoa(restart), func() bool {
				crashed = c.actor("f1")
				return crashed.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_CRASHED && crashed.GetStatus().GetRestarts() == int32(restart)
			})
			st := crashed.GetStatus()
			if st.GetExit().GetExitCode() != 1 || st.GetNextRestartTime() == nil {
				t.Fatalf("exit %d: status %v, want exit status 1 and a restart time", restart, st)
			}
			if restart == 2 {
				// While the back-off runs, a request is answered at once.
				status, header, body := c.routerGet("f1")
				if status != http.StatusServiceUnavailable || !strings.Contains(body, "actor default/f1: container app exited with status 1; it restarts in") || header.Get("Retry-After") == "" {
					t.Errorf("router during the back-off: %d %q (Retry-After %q), want 503 naming the exit and when it restarts", status, body, header.Get("Retry-After"))
				}
			}
			ev := c.lastEventTo("f1", torporv1.ActorState_ACTOR_STATE_CRASHED)
			if !strings.Contains(ev.GetReason(), "container app exited with status 1: fatal: boom") {
				t.Errorf("exit %d: event %q does not name the exit and its last line", restart, ev.GetReason())
			}
			_, after, _ := strings.Cut(ev.GetReason(), "; restart "+strconv.Itoa(restart)+" in ")
			delay, _, _ := strings.Cut(after, " ")
			delays = append(delays, delay)
		}
		if delays[0] != "1s" || delays[1] != "2s" {
			t.Errorf("back-offs %v, want 1s then 2s", delays)
		}
		c.waitFor("f1 to restart after its second exit", func() bool {
			return c.actor("f1").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING
		})
	})

	t.Run("golden build of a command that exits at once", func(t *testing.T) {
		tmpl := c.failedBuild(shellTemplate("instant", image, `echo bye >&2; exit 3`, nil))
		if msg := tmpl.GetStatus().GetMessage(); !strings.Contains(msg, "container app exited with status 3: bye") {
			t.Errorf("golden build failed with %q, want the exit named", msg)
		}
	})

	t.Run("golden build of a port nothing listens on", func(t *testing.T) {
		tmpl := c.failedBuild(shellTemplate("deaf", image, `sleep 1000`, func(s *torporv1.TemplateSpec) {
			s.Containers[0].Port = 9090
			s.Containers[0].ReadinessProbe = &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/bin/sh", "-c", "true"}}, TimeoutSeconds: 2}
		}))
		if msg := tmpl.GetStatus().GetMessage(); !strings.Contains(msg, "nothing accepts connections on port 9090") {
			t.Errorf("golden build failed with %q, want port 9090 named", msg)
		}
	})

	t.Run("the default port nothing listens on", func(t *testing.T) {
		tmpl := c.applyTemplate(shellTemplate("quiet", image, `sleep 1000`, nil))
		if msg := tmpl.GetStatus().GetMessage(); !strings.Contains(msg, "nothing accepts connections on port 8080") {
			t.Errorf("golden snapshot READY with message %q, want a warning naming port 8080", msg)
		}
		c.createActor("q1", "quiet")
		c.mustResume("q1")
		status, _, body := c.routerGet("q1")
		if status != http.StatusBadGateway || !strings.Contains(body, "nothing accepts connections on port 8080") {
			t.Errorf("router: %d %q, want 502 naming port 8080", status, body)
		}
	})
}

// failedBuild creates tmpl and waits for its golden build to fail.
func (c *cluster) failedBuild(tmpl *torporv1.Template) *torporv1.Template {
	c.t.Helper()
	if _, err := c.templates.CreateTemplate(c.ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tmpl})); err != nil {
		c.t.Fatal(err)
	}
	var got *torporv1.Template
	c.waitFor("golden build of "+tmpl.GetMetadata().GetName()+" to fail", func() bool {
		resp, err := c.templates.GetTemplate(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: tmpl.GetMetadata().GetName()}))
		if err != nil {
			c.t.Fatal(err)
		}
		got = resp.Msg
		if got.GetStatus().GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_READY {
			c.t.Fatalf("golden build of %s succeeded", tmpl.GetMetadata().GetName())
		}
		return got.GetStatus().GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED
	})
	return got
}
