package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// agentOutage is how long a node agent stays down in these tests: an
// agent restarting, far shorter than the heartbeat timeout.
const agentOutage = time.Second

// TestNodeAgentRestartMidStep kills the node agent (SIGKILL) of an actor,
// starts a step on it while the agent is down, and starts the agent again
// a second later: the step must wait for the agent and then finish, with
// no crash and no state lost (issue 11: the suspend answered unavailable,
// the actor went CRASHED, the restarted agent removed its live sandbox and
// the actor came back from an older snapshot).
func TestNodeAgentRestartMidStep(t *testing.T) {
	tests := []struct {
		name string
		// before runs with the actor RUNNING at count=4, the agent up.
		before func(c *cluster)
		// step runs while the agent is down.
		step func(c *cluster) (*torporv1.Actor, error)
		want torporv1.ActorState
	}{
		{
			name: "suspend",
			step: func(c *cluster) (*torporv1.Actor, error) {
				resp, err := c.actors.SuspendActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "c1"}))
				return resp.Msg, err
			},
			want: torporv1.ActorState_ACTOR_STATE_SUSPENDED,
		},
		{
			name:   "resume of a paused actor",
			before: func(c *cluster) { c.pause("c1") },
			step:   func(c *cluster) (*torporv1.Actor, error) { return c.resume("c1", nil) },
			want:   torporv1.ActorState_ACTOR_STATE_RUNNING,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1, heartbeatTimeout: 15 * time.Second})
			remote := c.startNodeProcess(1)
			c.applyTemplate(counterTemplate(t, "counter", nil))
			c.holdWorkerOf(c.nodes[0].name, "counter")
			c.createActor("c1", "counter")
			a := c.mustResume("c1")
			if n := a.GetStatus().GetWorker().GetNode(); n != remote.name {
				t.Fatalf("c1 runs on node %q, want the agent process's node %s", n, remote.name)
			}
			get(t, a)
			c.suspend("c1")
			a = c.mustResume("c1")
			for i := 2; i <= 4; i++ {
				if got, want := get(t, a), fmt.Sprintf("count=%d lines=%d", i, i); got != want {
					t.Fatalf("request %d: %q, want %q", i, got, want)
				}
			}
			if tt.before != nil {
				tt.before(c)
			}

			remote.kill()
			type outcome struct {
				a   *torporv1.Actor
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				a, err := tt.step(c)
				done <- outcome{a, err}
			}()
			c.waitFor("the step to be in flight", func() bool { return inFlight(c.actor("c1").GetStatus().GetState()) })
			// The outage itself: the agent stays down this long.
			time.Sleep(agentOutage)
			remote.restart(c)
			o := <-done
			if o.err != nil {
				t.Fatalf("%s across an agent restart: %v", tt.name, o.err)
			}
			if got := o.a.GetStatus().GetState(); got != tt.want {
				t.Fatalf("%s across an agent restart ended %v, want %v", tt.name, got, tt.want)
			}
			for _, ev := range c.events("c1") {
				if ev.GetToState() == torporv1.ActorState_ACTOR_STATE_CRASHED {
					t.Fatalf("c1 crashed: %s", ev.GetReason())
				}
			}
			a = c.mustResume("c1")
			if got := get(t, a); got != "count=5 lines=5" {
				t.Fatalf("after %s across an agent restart: %q, want count=5 lines=5 (nothing lost)", tt.name, got)
			}
			c.checkReciprocal()
			c.suspend("c1")
			remote.removeLeftovers(t)
		})
	}
}

// TestDatabaseRestartDuringFinalize stops PostgreSQL while a resume and
// then a suspend are finalizing, and starts it again a second later: each
// step must finish by itself once the database is back, instead of staying
// -ING until the recovery sweep minutes later.
func TestDatabaseRestartDuringFinalize(t *testing.T) {
	pg := storetest.StartPostgres(t)
	c := newCluster(t, clusterOptions{storeURL: pg.URL(), workersPerNode: 1})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")

	// outage stops the database for a second, once per step.
	var restarted sync.WaitGroup
	t.Cleanup(restarted.Wait)
	outage := func(*torporv1.Actor) {
		pg.Stop(t)
		restarted.Go(func() {
			time.Sleep(time.Second)
			pg.Start(t)
		})
	}
	c.server.Engine().SetHooks(workflow.Hooks{BeforeResumeFinalize: outage})
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	defer cancel()
	resp, err := c.actors.ResumeActor(ctx, connect.NewRequest(&torporv1.ResumeActorRequest{Space: "default", Name: "c1"}))
	if err != nil {
		t.Fatalf("resume across a database restart at its finalize: %v", err)
	}
	if got := resp.Msg.GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("resume ended %v, want RUNNING", got)
	}
	if got := get(t, resp.Msg); got != "count=1 lines=1" {
		t.Fatalf("after the resume: %q", got)
	}
	restarted.Wait()
	c.server.Engine().SetHooks(workflow.Hooks{BeforeCheckpointFinalize: outage})
	s, err := c.actors.SuspendActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "c1"}))
	if err != nil {
		t.Fatalf("suspend across a database restart at its finalize: %v", err)
	}
	if got := s.Msg.GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("suspend ended %v, want SUSPENDED", got)
	}
	restarted.Wait()
	c.server.Engine().SetHooks(workflow.Hooks{})
	if got := get(t, c.mustResume("c1")); got != "count=2 lines=2" {
		t.Fatalf("after the suspend: %q, want count=2 lines=2", got)
	}
	c.checkReciprocal()
}
