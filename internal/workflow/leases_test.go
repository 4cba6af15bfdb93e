package workflow

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/exits"
	"github.com/torpor-dev/torpor/internal/store"
)

// runningSandbox creates an E2B sandbox on template with a lease of lease
// from the engine's now, and resumes it.
func (e *env) runningSandbox(name, template string, lease time.Duration, autoPause bool) *torporv1.Actor {
	e.t.Helper()
	if _, err := e.store.Actors().Create(e.ctx, &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: name},
		Spec: &torporv1.ActorSpec{Template: template, TemplateRevision: 1, Sandbox: &torporv1.Sandbox{
			EndTime: timestamppb.New(e.engine.now().Add(lease)), AutoPause: autoPause, TimeoutSeconds: int32(lease / time.Second),
		}},
		Status: &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED},
	}); err != nil {
		e.t.Fatal(err)
	}
	a, err := e.engine.Resume(e.ctx, "default", name, ResumeOptions{})
	if err != nil {
		e.t.Fatalf("resume sandbox %s: %v", name, err)
	}
	return a
}

func (e *env) enforceLeases() {
	e.t.Helper()
	if err := e.engine.EnforceLeases(e.ctx); err != nil {
		e.t.Fatalf("enforce leases: %v", err)
	}
}

// eventsOf are the reasons in the history of the actor of uid (which
// outlives a deleted actor's record).
func (e *env) eventsOf(uid string) string {
	e.t.Helper()
	events, err := e.store.Events(e.ctx, uid, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	var reasons []string
	for _, ev := range events {
		reasons = append(reasons, ev.Reason)
	}
	return strings.Join(reasons, "\n")
}

// leaseEnds reads the engine's count of lease ends by action.
func leaseEnds(t *testing.T, e *Engine, action string) float64 {
	t.Helper()
	var m dto.Metric
	if err := e.metrics.leaseEnds.WithLabelValues(action).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func leaseEnd(a *torporv1.Actor) time.Time { return a.GetSpec().GetSandbox().GetEndTime().AsTime() }

// TestLeaseKeepsSandboxFromIdleAndEviction: while its lease runs, a
// sandbox outlives its template's idle policy, and an eviction passes it
// over, saying why when nothing else can go.
func TestLeaseKeepsSandboxFromIdleAndEviction(t *testing.T) {
	e := newEnv(t, 2, "n1")
	c := e.fakeClock()
	e.templateWithIdle("suspend5", &torporv1.IdlePolicy{IdleSeconds: 5, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND})
	e.runningSandbox("s1", "suspend5", time.Hour, false)
	e.runningOnTemplate("plain", "suspend5")
	c.advance(10 * time.Second)
	e.sweep()
	e.enforceLeases()
	wantState(t, e.actor("plain"), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	wantState(t, e.actor("s1"), torporv1.ActorState_ACTOR_STATE_RUNNING)

	// Both workers busy: the ordinary actor is evicted, never the sandbox.
	e.runningOnTemplate("other", "counter")
	c.advance(10 * time.Second)
	e.createActorOn("newcomer", "counter")
	if _, err := e.engine.Resume(e.ctx, "default", "newcomer", ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	wantState(t, e.actor("other"), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	wantState(t, e.actor("s1"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	_, err := e.engine.Resume(e.ctx, "default", "plain", ResumeOptions{})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "1 E2B sandboxes, kept until their lease ends") {
		t.Fatalf("resume with only a sandbox and a fresh actor running: %v, want ResourceExhausted naming the sandbox", err)
	}
	wantState(t, e.actor("s1"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	e.checkPlacement()
}

// TestLeaseEndKillsSandbox: at its lease's end a sandbox without
// auto_pause is deleted without a snapshot, its workload stopped on the
// node, and its history says why.
func TestLeaseEndKillsSandbox(t *testing.T) {
	e := newEnv(t, 1, "n1")
	c := e.fakeClock()
	s := e.runningSandbox("s1", "counter", 5*time.Second, false)
	c.advance(4 * time.Second)
	e.enforceLeases()
	wantState(t, e.actor("s1"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	c.advance(time.Second)
	e.enforceLeases()
	if _, err := e.store.Actors().Get(e.ctx, "default", "s1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("sandbox after its lease: %v, want it deleted", err)
	}
	agent := e.agents["n1"]
	if n := agent.callCount("Checkpoint"); n != 0 {
		t.Errorf("the kill checkpointed %d times", n)
	}
	if len(agent.slots) != 0 {
		t.Errorf("the workload still runs on the node: %v", agent.slots)
	}
	if snaps, _, err := e.store.Snapshots().List(e.ctx, store.ListOptions{Filter: store.Filter{"actor_uid": s.GetMetadata().GetUid()}}); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots of the killed sandbox: %v %v, want none", snaps, err)
	}
	if h := e.eventsOf(s.GetMetadata().GetUid()); !strings.Contains(h, "lease ended: killed") {
		t.Errorf("history does not say the lease ended:\n%s", h)
	}
	if n := leaseEnds(t, e.engine, "kill"); n != 1 {
		t.Errorf("lease ends (kill) = %v, want 1", n)
	}
	e.checkPlacement()
}

// TestLeaseEndKillsCrashedSandbox: a sandbox whose workload exited is
// killed at its lease's end like a running one (nothing of it is left),
// unless it asked for auto_pause: then it stays, paused for E2B, until a
// connect resumes it.
func TestLeaseEndKillsCrashedSandbox(t *testing.T) {
	for _, autoPause := range []bool{false, true} {
		e := newEnv(t, 1, "n1")
		c := e.fakeClock()
		s := e.runningSandbox("s1", "counter", 5*time.Second, autoPause)
		st := s.GetStatus()
		if err := e.engine.ReportExit(e.ctx, "n1", st.GetWorker().GetName(), s.GetMetadata().GetUid(), st.GetRunOperation(), exits.New("main", 1, nil, time.Now())); err != nil {
			t.Fatal(err)
		}
		wantState(t, e.actor("s1"), torporv1.ActorState_ACTOR_STATE_CRASHED)
		c.advance(6 * time.Second)
		e.enforceLeases()
		_, err := e.store.Actors().Get(e.ctx, "default", "s1")
		switch {
		case autoPause && err != nil:
			t.Fatalf("auto_pause: the crashed sandbox after its lease: %v, want it kept", err)
		case autoPause:
			wantState(t, e.actor("s1"), torporv1.ActorState_ACTOR_STATE_CRASHED)
		case !errors.Is(err, store.ErrNotFound):
			t.Fatalf("the crashed sandbox after its lease: %v, want it deleted", err)
		}
		e.checkPlacement()
	}
}

// TestLeaseEndPausesAutoPauseSandbox: with auto_pause the lease's end
// suspends the sandbox, which stays suspended however long after; a
// resume (traffic, with auto_resume) gives it a new lease of its timeout,
// so the next pass leaves it running.
func TestLeaseEndPausesAutoPauseSandbox(t *testing.T) {
	e := newEnv(t, 1, "n1")
	c := e.fakeClock()
	e.runningSandbox("s1", "counter", 5*time.Second, true)
	c.advance(6 * time.Second)
	e.enforceLeases()
	a := e.actor("s1")
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	if a.GetStatus().GetLatestSnapshot() == "" {
		t.Fatal("the paused sandbox has no snapshot to resume from")
	}
	if !e.hasEvent("s1", "lease ended: paused") {
		t.Errorf("history does not say the lease ended:\n%s", e.eventsOf(a.GetMetadata().GetUid()))
	}
	c.advance(time.Hour)
	e.enforceLeases()
	e.sweep()
	wantState(t, e.actor("s1"), torporv1.ActorState_ACTOR_STATE_SUSPENDED)

	resumed, err := e.engine.Resume(e.ctx, "default", "s1", ResumeOptions{OnDemand: true})
	if err != nil {
		t.Fatal(err)
	}
	sb := resumed.GetSpec().GetSandbox()
	if want := c.now().Add(5 * time.Second); !sb.GetEndTime().AsTime().Equal(want) || !sb.GetStartTime().AsTime().Equal(c.now()) {
		t.Fatalf("resumed sandbox lease %v, want start now and end %s", sb, want)
	}
	e.enforceLeases()
	wantState(t, e.actor("s1"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	if n := leaseEnds(t, e.engine, "pause"); n != 1 {
		t.Errorf("lease ends (pause) = %v, want 1", n)
	}
	e.checkPlacement()
}

// TestLeaseMovedBeforeItsEndWins: a connect that moves the lease after
// the pass listed the sandbox, even after the pass read it again, keeps
// the sandbox running; the pass acts only on the version it read.
func TestLeaseMovedBeforeItsEndWins(t *testing.T) {
	for _, autoPause := range []bool{false, true} {
		t.Run(map[bool]string{false: "kill", true: "pause"}[autoPause], func(t *testing.T) {
			e := newEnv(t, 1, "n1")
			c := e.fakeClock()
			e.runningSandbox("s1", "counter", 5*time.Second, autoPause)
			c.advance(6 * time.Second)
			moved := false
			e.engine.SetHooks(Hooks{BeforeLeaseEnd: func(*torporv1.Actor) {
				if moved {
					return
				}
				moved = true
				if _, err := e.engine.UpdateLease(e.ctx, "default", "s1", LeaseUpdate{Timeout: time.Minute, ExtendOnly: true}); err != nil {
					t.Error(err)
				}
			}})
			e.enforceLeases()
			if !moved {
				t.Fatal("the pass did not come to the sandbox")
			}
			a := e.actor("s1")
			wantState(t, a, torporv1.ActorState_ACTOR_STATE_RUNNING)
			if !leaseEnd(a).Equal(c.now().Add(time.Minute)) {
				t.Fatalf("lease end %s, want the connect's", leaseEnd(a))
			}
			// The next pass reads the moved lease and leaves it.
			e.enforceLeases()
			wantState(t, e.actor("s1"), torporv1.ActorState_ACTOR_STATE_RUNNING)
			e.checkPlacement()
		})
	}
}

// TestLeaseEndOnceAcrossReplicas: replicas enforcing leases at the same
// time end each lease once.
func TestLeaseEndOnceAcrossReplicas(t *testing.T) {
	e := newEnv(t, 4, "n1")
	c := e.fakeClock()
	for _, name := range []string{"k1", "k2"} {
		e.runningSandbox(name, "counter", time.Second, false)
	}
	for _, name := range []string{"p1", "p2"} {
		e.runningSandbox(name, "counter", time.Second, true)
	}
	c.advance(2 * time.Second)
	other := New(e.store, e.agents, e.objects, Options{HeartbeatTimeout: time.Minute}, slog.New(slog.DiscardHandler))
	other.now = c.now
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, eng := range []*Engine{e.engine, other} {
		wg.Go(func() { errs[i] = eng.EnforceLeases(e.ctx) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Errorf("enforce leases: %v", err)
		}
	}
	for _, name := range []string{"k1", "k2"} {
		if _, err := e.store.Actors().Get(e.ctx, "default", name); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("sandbox %s after its lease: %v, want it deleted", name, err)
		}
	}
	for _, name := range []string{"p1", "p2"} {
		wantState(t, e.actor(name), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	}
	if n := e.agents["n1"].callCount("Checkpoint"); n != 2 {
		t.Errorf("%d checkpoints for two auto-paused sandboxes", n)
	}
	kills := leaseEnds(t, e.engine, "kill") + leaseEnds(t, other, "kill")
	pauses := leaseEnds(t, e.engine, "pause") + leaseEnds(t, other, "pause")
	if kills != 2 || pauses != 2 {
		t.Errorf("lease ends: %v kills, %v pauses across replicas, want 2 and 2", kills, pauses)
	}
	e.checkPlacement()
}

// TestUpdateLease: connect (ExtendOnly) never moves the end earlier,
// setTimeout does; an actor that is no sandbox is NotFound.
func TestUpdateLease(t *testing.T) {
	e := newEnv(t, 2, "n1")
	c := e.fakeClock()
	e.runningSandbox("s1", "counter", time.Hour, false)
	e.runningOnTemplate("plain", "counter")
	for _, tc := range []struct {
		name string
		u    LeaseUpdate
		want time.Duration
	}{
		{"connect does not shorten", LeaseUpdate{Timeout: time.Minute, ExtendOnly: true}, time.Hour},
		{"connect extends", LeaseUpdate{Timeout: 2 * time.Hour, ExtendOnly: true}, 2 * time.Hour},
		{"set timeout shortens to an hour", LeaseUpdate{Timeout: time.Hour / 2}, time.Hour / 2},
		{"connect by the sandbox's own timeout", LeaseUpdate{ExtendOnly: true}, time.Hour},
		{"set timeout shortens", LeaseUpdate{Timeout: time.Minute}, time.Minute},
		{"set timeout ends it now", LeaseUpdate{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := e.engine.UpdateLease(e.ctx, "default", "s1", tc.u)
			if err != nil {
				t.Fatal(err)
			}
			if want := c.now().Add(tc.want); !leaseEnd(a).Equal(want) || !leaseEnd(e.actor("s1")).Equal(want) {
				t.Fatalf("lease end %s, want %s", leaseEnd(a), want)
			}
		})
	}
	for _, name := range []string{"plain", "nosuch"} {
		if _, err := e.engine.UpdateLease(e.ctx, "default", name, LeaseUpdate{Timeout: time.Minute}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("lease of %s: %v, want NotFound", name, err)
		}
	}
	if _, err := e.engine.UpdateLease(e.ctx, "default", "s1", LeaseUpdate{Timeout: -time.Second}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("negative lease: %v, want InvalidArgument", err)
	}
}
