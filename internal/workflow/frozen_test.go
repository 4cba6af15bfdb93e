package workflow

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// freeze reports name's workload frozen (or thawed) by its node at t.
func (e *env) freeze(name string, frozen bool, t time.Time) {
	e.t.Helper()
	a := e.actor(name)
	w := a.GetStatus().GetWorker()
	if err := e.engine.ReportFrozen(e.ctx, w.GetNode(), w.GetName(), a.GetMetadata().GetUid(), a.GetStatus().GetRunOperation(), frozen, t); err != nil {
		e.t.Fatalf("report %s frozen=%v: %v", name, frozen, err)
	}
}

func TestReportFrozen(t *testing.T) {
	e := newEnv(t, 2, "n1")
	c := e.fakeClock()
	e.templateWithIdle("freezing", &torporv1.IdlePolicy{FreezeSeconds: 30})
	e.runningOnTemplate("a", "freezing")
	a := e.actor("a")
	w := a.GetStatus().GetWorker()

	// Reports of another workload, worker or node change nothing.
	for _, stale := range []struct{ node, worker, uid, op string }{
		{"n1", w.GetName(), a.GetMetadata().GetUid(), "op-before"},
		{"n1", "n1-w1", a.GetMetadata().GetUid(), a.GetStatus().GetRunOperation()},
		{"n1", w.GetName(), "other-uid", a.GetStatus().GetRunOperation()},
	} {
		if err := e.engine.ReportFrozen(e.ctx, stale.node, stale.worker, stale.uid, stale.op, true, c.now()); err != nil {
			t.Fatalf("stale report %+v: %v", stale, err)
		}
	}
	if e.actor("a").GetStatus().GetFrozenTime() != nil {
		t.Fatal("a stale report froze the actor")
	}
	if err := e.engine.ReportFrozen(e.ctx, "n2", w.GetName(), a.GetMetadata().GetUid(), a.GetStatus().GetRunOperation(), true, c.now()); err == nil {
		t.Fatal("a report naming another node's worker was accepted")
	}

	frozenAt := c.now()
	e.freeze("a", true, frozenAt)
	e.freeze("a", true, frozenAt.Add(time.Second)) // a repeat changes nothing
	st := e.actor("a").GetStatus()
	if st.GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING || !st.GetFrozenTime().AsTime().Equal(frozenAt) {
		t.Fatalf("frozen actor: %s since %v, want RUNNING since %v", st.GetState(), st.GetFrozenTime(), frozenAt)
	}
	c.advance(5 * time.Second)
	e.freeze("a", false, c.now())
	if e.actor("a").GetStatus().GetFrozenTime() != nil {
		t.Fatal("thawed actor still shown frozen")
	}
	var reasons []string
	for _, ev := range e.events("a") {
		if ev.FromState == ev.ToState {
			reasons = append(reasons, ev.Reason)
		}
	}
	if len(reasons) != 2 || !strings.HasPrefix(reasons[0], "frozen: no traffic, exec or file access for 30s") || !strings.HasPrefix(reasons[1], "thawed: ") {
		t.Fatalf("events: %q, want one freeze and one thaw", reasons)
	}

	// Leaving RUNNING clears the mark.
	e.freeze("a", true, c.now())
	if _, err := e.engine.Suspend(e.ctx, "default", "a"); err != nil {
		t.Fatal(err)
	}
	if e.actor("a").GetStatus().GetFrozenTime() != nil {
		t.Fatal("a suspended actor is still shown frozen")
	}
}

func TestEvictionTakesFrozenActorsFirst(t *testing.T) {
	e := newEnv(t, 3, "n1")
	c := e.fakeClock()
	e.templateWithIdle("plain", &torporv1.IdlePolicy{Eviction: &torporv1.EvictionPolicy{MinIdleSeconds: 1}})
	e.templateWithIdle("low", &torporv1.IdlePolicy{Eviction: &torporv1.EvictionPolicy{MinIdleSeconds: 1, Priority: -1}})
	e.runningOnTemplate("oldest", "plain")
	c.advance(time.Minute)
	e.runningOnTemplate("frozen", "plain")
	e.runningOnTemplate("low", "low")
	c.advance(time.Minute)
	e.freeze("frozen", true, c.now())
	// low goes first (its priority is explicit), then the frozen one,
	// though oldest was active before it.
	for i, want := range []string{"low", "frozen", "oldest"} {
		name := fmt.Sprintf("new-%d", i)
		e.createActor(name)
		if _, err := e.engine.Resume(e.ctx, "default", name, ResumeOptions{}); err != nil {
			t.Fatalf("resume %s: %v", name, err)
		}
		wantState(t, e.actor(want), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	}
	if r := lastReason(e, "frozen", torporv1.ActorState_ACTOR_STATE_SUSPENDING); !strings.Contains(r, ", frozen)") {
		t.Errorf("the frozen actor's eviction says %q, want it named frozen", r)
	}
	e.checkPlacement()
}

func TestRelieveMemoryTakesFrozenActorsDown(t *testing.T) {
	e := newEnv(t, 4, "n1", "n2")
	e.engine.opts.NodeMemoryFloor = 10
	c := e.fakeClock()
	e.templateWithIdle("freezing", &torporv1.IdlePolicy{FreezeSeconds: 5, Action: torporv1.IdleAction_IDLE_ACTION_PAUSE})
	e.templateWithIdle("pinned", &torporv1.IdlePolicy{FreezeSeconds: 5, Eviction: &torporv1.EvictionPolicy{Never: true}})
	heartbeat := func(node string, avail int64) {
		t.Helper()
		n, err := e.store.Nodes().Get(e.ctx, "", node)
		if err != nil {
			t.Fatal(err)
		}
		n.HeartbeatTime = timestamppb.New(c.now())
		n.MemoryAvailableBytes, n.MemoryTotalBytes = avail<<20, 1000<<20
		if _, err := e.store.Nodes().Update(e.ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	var onN1 []string
	for i := range 6 {
		name := fmt.Sprintf("a%d", i)
		template := "freezing"
		if i == 5 {
			template = "pinned"
		}
		e.runningOnTemplate(name, template)
		if e.actor(name).GetStatus().GetWorker().GetNode() == "n1" {
			onN1 = append(onN1, name)
		}
		c.advance(time.Second)
	}
	for _, name := range []string{"a0", "a1", "a2", "a3", "a4", "a5"} {
		e.freeze(name, true, c.now())
	}
	c.advance(time.Second)
	heartbeat("n1", 50) // 5%: short
	heartbeat("n2", 500)
	e.sweep()
	e.sweep() // no newer reading: nothing more
	stopped := func() []string {
		var out []string
		for _, name := range []string{"a0", "a1", "a2", "a3", "a4", "a5"} {
			if e.actor(name).GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING {
				out = append(out, name)
			}
		}
		return out
	}
	// The least recently active frozen actor of n1, and only that one.
	if got := stopped(); len(got) != 1 || got[0] != onN1[0] {
		t.Fatalf("after one short reading of n1 (its actors %v): stopped %v, want %s", onN1, got, onN1[0])
	}
	wantState(t, e.actor(onN1[0]), torporv1.ActorState_ACTOR_STATE_PAUSED)
	if r := lastReason(e, onN1[0], torporv1.ActorState_ACTOR_STATE_PAUSING); !strings.Contains(r, "node n1 is short of memory (50 MiB of 1000 MiB available, below its floor of 10%)") {
		t.Errorf("its pause says %q", r)
	}
	c.advance(time.Second)
	heartbeat("n1", 200) // 20%: enough
	e.sweep()
	if got := stopped(); len(got) != 1 {
		t.Fatalf("with n1 above its floor: stopped %v", got)
	}
	// Short again for as long as it takes: every frozen actor of n1 but a
	// pinned one goes, one a reading; n2's stay.
	for range 6 {
		c.advance(time.Second)
		heartbeat("n1", 10)
		e.sweep()
	}
	for _, name := range []string{"a0", "a1", "a2", "a3", "a4", "a5"} {
		st := e.actor(name).GetStatus().GetState()
		onFirst := e.actor(name).GetStatus().GetWorker().GetNode() == "n1" || st == torporv1.ActorState_ACTOR_STATE_PAUSED
		switch {
		case name == "a5" || !onFirst:
			if st != torporv1.ActorState_ACTOR_STATE_RUNNING {
				t.Errorf("%s is %s, want RUNNING (pinned, or on n2)", name, st)
			}
		case st != torporv1.ActorState_ACTOR_STATE_PAUSED:
			t.Errorf("%s on short n1 is %s, want PAUSED", name, st)
		}
	}
}

// events is the history of actor name.
func (e *env) events(name string) []store.Event {
	e.t.Helper()
	events, err := e.store.Events(e.ctx, e.actor(name).GetMetadata().GetUid(), 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return events
}

// lastReason is the reason of name's last event into state.
func lastReason(e *env, name string, state torporv1.ActorState) string {
	var r string
	for _, ev := range e.events(name) {
		if ev.ToState == state {
			r = ev.Reason
		}
	}
	return r
}
