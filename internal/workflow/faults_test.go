package workflow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
)

// waitUntil polls cond for up to 10 s.
func (e *env) waitUntil(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// crashes counts the actor's transitions to CRASHED.
func (e *env) crashes(name string) int {
	e.t.Helper()
	events, err := e.store.Events(e.ctx, e.actor(name).GetMetadata().GetUid(), 0)
	if err != nil {
		e.t.Fatal(err)
	}
	n := 0
	for _, ev := range events {
		if ev.ToState == torporv1.ActorState_ACTOR_STATE_CRASHED {
			n++
		}
	}
	return n
}

// setHeartbeat moves the node's last heartbeat to at.
func (e *env) setHeartbeat(node string, at time.Time) {
	e.t.Helper()
	n, err := e.store.Nodes().Get(e.ctx, "", node)
	if err != nil {
		e.t.Fatal(err)
	}
	n.HeartbeatTime = timestamppb.New(at)
	if _, err := e.store.Nodes().Update(e.ctx, n); err != nil {
		e.t.Fatal(err)
	}
}

// stepAcrossOutage starts step while node n1 does not answer, checks that
// the actor stays in its -ING state through several unanswered calls,
// brings the node back and returns the step's outcome.
func (e *env) stepAcrossOutage(during torporv1.ActorState, step func(context.Context) (*torporv1.Actor, error)) (*torporv1.Actor, error) {
	e.t.Helper()
	agent := e.agents["n1"]
	agent.down.Store(true)
	type outcome struct {
		a   *torporv1.Actor
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		a, err := step(e.ctx)
		done <- outcome{a, err}
	}()
	e.waitUntil("three unanswered node calls", func() bool { return agent.unanswered.Load() >= 3 })
	wantState(e.t, e.actor("c1"), during)
	agent.down.Store(false)
	o := <-done
	return o.a, o.err
}

// TestUnreachableNodeKeepsTheStep: a node that does not answer for a while
// (an agent restarting) leaves the step in flight; once it answers, the
// step ends as if nothing happened. Before, the actor went CRASHED.
func TestUnreachableNodeKeepsTheStep(t *testing.T) {
	tests := []struct {
		name   string
		before func(e *env) // from RUNNING
		during torporv1.ActorState
		step   func(e *Engine) func(context.Context) (*torporv1.Actor, error)
		want   torporv1.ActorState
	}{
		{name: "suspend", during: torporv1.ActorState_ACTOR_STATE_SUSPENDING, want: torporv1.ActorState_ACTOR_STATE_SUSPENDED,
			step: func(e *Engine) func(context.Context) (*torporv1.Actor, error) {
				return func(ctx context.Context) (*torporv1.Actor, error) { return e.Suspend(ctx, "default", "c1") }
			}},
		{name: "pause", during: torporv1.ActorState_ACTOR_STATE_PAUSING, want: torporv1.ActorState_ACTOR_STATE_PAUSED,
			step: func(e *Engine) func(context.Context) (*torporv1.Actor, error) {
				return func(ctx context.Context) (*torporv1.Actor, error) { return e.Pause(ctx, "default", "c1") }
			}},
		{name: "resume of a paused actor", during: torporv1.ActorState_ACTOR_STATE_RESUMING, want: torporv1.ActorState_ACTOR_STATE_RUNNING,
			before: func(e *env) {
				if _, err := e.engine.Pause(e.ctx, "default", "c1"); err != nil {
					e.t.Fatal(err)
				}
			},
			step: func(e *Engine) func(context.Context) (*torporv1.Actor, error) {
				return func(ctx context.Context) (*torporv1.Actor, error) {
					return e.Resume(ctx, "default", "c1", ResumeOptions{})
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 1, "n1")
			e.createActor("c1")
			if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
				t.Fatal(err)
			}
			if tt.before != nil {
				tt.before(e)
			}
			a, err := e.stepAcrossOutage(tt.during, tt.step(e.engine))
			if err != nil {
				t.Fatalf("%s across a node outage: %v", tt.name, err)
			}
			wantState(t, a, tt.want)
			if n := e.crashes("c1"); n != 0 {
				t.Fatalf("the actor crashed %d times across a node outage", n)
			}
			if tt.want == torporv1.ActorState_ACTOR_STATE_RUNNING {
				if src := e.agents["n1"].lastRestore().GetSnapshot(); src.GetNode() != "n1" {
					t.Fatalf("resumed from %v, want the local checkpoint on n1", src)
				}
			}
			e.checkPlacement()
		})
	}
}

// TestLostNodeEndsTheRetries: a node that stays away past its heartbeat
// timeout is lost: the step in flight crashes the actor, whose reason names
// the node and the state it keeps.
func TestLostNodeEndsTheRetries(t *testing.T) {
	for _, step := range []string{"suspend", "resume"} {
		t.Run(step, func(t *testing.T) {
			e := newEnv(t, 1, "n1")
			e.createActor("c1")
			if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
				t.Fatal(err)
			}
			var latest string
			if step == "resume" {
				s, err := e.engine.Suspend(e.ctx, "default", "c1")
				if err != nil {
					t.Fatal(err)
				}
				latest = s.GetStatus().GetLatestSnapshot()
			}
			agent := e.agents["n1"]
			agent.down.Store(true)
			errc := make(chan error, 1)
			go func() {
				var err error
				if step == "resume" {
					_, err = e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
				} else {
					_, err = e.engine.Suspend(e.ctx, "default", "c1")
				}
				errc <- err
			}()
			e.waitUntil("an unanswered node call", func() bool { return agent.unanswered.Load() >= 1 })
			e.setHeartbeat("n1", time.Now().Add(-2*time.Minute))
			if err := <-errc; err == nil {
				t.Fatalf("%s on a lost node succeeded", step)
			}
			a := e.actor("c1")
			wantState(t, a, torporv1.ActorState_ACTOR_STATE_CRASHED)
			reason := a.GetStatus().GetCrashReason()
			if !strings.Contains(reason, "n1 stopped heartbeating") {
				t.Fatalf("crash reason %q does not say node n1 was lost", reason)
			}
			want := "no snapshot"
			if latest != "" {
				want = "snapshot " + latest
			}
			if !strings.Contains(reason, want) {
				t.Fatalf("crash reason %q does not name the state kept (%s)", reason, want)
			}
			e.checkPlacement()
		})
	}
}

// TestFailedResumeKeepsTheNewestState: a PAUSED actor whose resume fails
// on the node keeps its local checkpoint, its newest state, for the next
// resume; only a checkpoint the node found spoilt (DataLoss) is dropped,
// and then the latest durable snapshot is used and the events say so.
func TestFailedResumeKeepsTheNewestState(t *testing.T) {
	tests := []struct {
		name      string
		failure   error
		wantLocal bool
	}{
		{name: "sandbox failed to start", failure: connect.NewError(connect.CodeInternal, errors.New("runsc restore: exit status 128")), wantLocal: true},
		{name: "checkpoint spoilt", failure: connect.NewError(connect.CodeDataLoss, errors.New("pages.img: sha256 mismatch")), wantLocal: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 1, "n1")
			e.createActor("c1")
			if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.engine.Suspend(e.ctx, "default", "c1"); err != nil {
				t.Fatal(err)
			}
			if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
				t.Fatal(err)
			}
			paused, err := e.engine.Pause(e.ctx, "default", "c1")
			if err != nil {
				t.Fatal(err)
			}
			local, durable := paused.GetStatus().GetLocalCheckpoint(), paused.GetStatus().GetLatestSnapshot()
			e.agents["n1"].failRestore = tt.failure
			if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); errdefs.Code(err) != connect.CodeOf(tt.failure) {
				t.Fatalf("failed resume: %v, want the node's %v", err, connect.CodeOf(tt.failure))
			}
			crashed := e.actor("c1")
			wantState(t, crashed, torporv1.ActorState_ACTOR_STATE_CRASHED)
			if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
				t.Fatal(err)
			}
			got := e.agents["n1"].lastRestore().GetSnapshot()
			want, wantNode := durable, ""
			if tt.wantLocal {
				want, wantNode = local, "n1"
			}
			if !strings.HasSuffix(got.GetLocation(), "/"+want) || got.GetNode() != wantNode {
				t.Fatalf("resume after the crash restored %v, want %s on node %q", got, want, wantNode)
			}
			if !strings.Contains(crashed.GetStatus().GetCrashReason(), want) {
				t.Fatalf("crash reason %q does not name %s, the state kept", crashed.GetStatus().GetCrashReason(), want)
			}
			e.checkPlacement()
		})
	}
}

// TestCallerGivingUpLeavesTheStepToItsDriver: a caller whose deadline
// passes while the node is away gets an error saying the step goes on, and
// the step finishes once the node answers, without waiting for Recover.
func TestCallerGivingUpLeavesTheStepToItsDriver(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	agent := e.agents["n1"]
	agent.down.Store(true)
	ctx, cancel := context.WithTimeout(e.ctx, 200*time.Millisecond)
	defer cancel()
	_, err := e.engine.Suspend(ctx, "default", "c1")
	if errdefs.Code(err) != connect.CodeDeadlineExceeded || !strings.Contains(err.Error(), "goes on") {
		t.Fatalf("suspend past its caller's deadline: %v, want DeadlineExceeded saying the step goes on", err)
	}
	wantState(t, e.actor("c1"), torporv1.ActorState_ACTOR_STATE_SUSPENDING)
	agent.down.Store(false)
	e.waitUntil("the suspend to finish without its caller", func() bool {
		return e.actor("c1").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_SUSPENDED
	})
	if n := e.crashes("c1"); n != 0 {
		t.Fatalf("the actor crashed %d times", n)
	}
}

// flakyStore refuses the next failures transactions as a restarting
// database does.
type flakyStore struct {
	store.Store
	failures atomic.Int64
}

func (s *flakyStore) InTx(ctx context.Context, fn func(tx store.Tx) error) error {
	if s.failures.Add(-1) >= 0 {
		return fmt.Errorf("commit transaction: %w", store.ErrUnavailable)
	}
	return s.Store.InTx(ctx, fn)
}

// TestFinalizeRidesOutAStoreOutage: a step whose end the store refuses for
// a while (longer than the store's own retries) writes it again and ends;
// before, it stayed -ING until the recovery sweep minutes later.
func TestFinalizeRidesOutAStoreOutage(t *testing.T) {
	for _, step := range []string{"resume", "suspend"} {
		t.Run(step, func(t *testing.T) {
			e := newEnv(t, 1, "n1")
			flaky := &flakyStore{Store: e.store}
			e.engine = New(flaky, e.agents, e.objects, Options{HeartbeatTimeout: time.Minute}, slog.New(slog.DiscardHandler))
			e.createActor("c1")
			if step == "suspend" {
				if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// Once the step is claimed, the store refuses the next three
			// transactions: the finalize's.
			outage := func(*torporv1.Actor) { flaky.failures.Store(3) }
			e.engine.SetHooks(Hooks{AfterResumeClaim: outage, AfterCheckpointClaim: outage})
			var a *torporv1.Actor
			var err error
			if step == "resume" {
				a, err = e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
			} else {
				a, err = e.engine.Suspend(e.ctx, "default", "c1")
			}
			if err != nil {
				t.Fatalf("%s across a store outage at its finalize: %v", step, err)
			}
			want := torporv1.ActorState_ACTOR_STATE_RUNNING
			if step == "suspend" {
				want = torporv1.ActorState_ACTOR_STATE_SUSPENDED
			}
			wantState(t, a, want)
			e.checkPlacement()
		})
	}
}

// TestGoldenBuildWaitsForItsNode: a golden build whose node does not
// answer goes back to PENDING and is built once the node is back, instead
// of leaving the template FAILED for a node restart.
func TestGoldenBuildWaitsForItsNode(t *testing.T) {
	e := newEnv(t, 1, "n1")
	agent := e.agents["n1"]
	agent.down.Store(true)
	if err := e.engine.BuildGoldens(e.ctx); err != nil {
		t.Fatal(err)
	}
	tmpl := e.revision("counter@1")
	if got := tmpl.GetStatus().GetPhase(); got != torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING {
		t.Fatalf("golden build on a node that does not answer: %v (%s), want PENDING", got, tmpl.GetStatus().GetMessage())
	}
	e.checkPlacement()
	agent.down.Store(false)
	if err := e.engine.BuildGoldens(e.ctx); err != nil {
		t.Fatal(err)
	}
	tmpl = e.revision("counter@1")
	if got := tmpl.GetStatus().GetPhase(); got != torporv1.TemplatePhase_TEMPLATE_PHASE_READY {
		t.Fatalf("golden build with the node back: %v (%s), want READY", got, tmpl.GetStatus().GetMessage())
	}
}
