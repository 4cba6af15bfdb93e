package workflow

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// clock is a settable engine clock. It starts an hour behind the real
// one, which dates what the store stamps itself (activity reports, node
// heartbeats): those stay fresh however far a test advances it.
type clock struct{ t atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.t.Load()) }
func (c *clock) advance(d time.Duration) { c.t.Add(int64(d)) }
func (e *env) fakeClock() *clock {
	c := &clock{}
	c.t.Store(time.Now().Add(-time.Hour).UnixNano())
	e.engine.now = c.now
	return c
}

// templateWithIdle creates template name with idle policy p (nil: none).
func (e *env) templateWithIdle(name string, p *torporv1.IdlePolicy) {
	e.createTemplateSpec(name, &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers:   []*torporv1.Container{{Name: "main", Image: "img"}},
		IdlePolicy:   p,
	}, torporv1.FromData_FROM_DATA_COLD_BOOT)
}

// runningOnTemplate creates an actor on template and resumes it.
func (e *env) runningOnTemplate(name, template string) {
	e.t.Helper()
	e.createActorOn(name, template)
	if _, err := e.engine.Resume(e.ctx, "default", name, ResumeOptions{}); err != nil {
		e.t.Fatalf("resume %s: %v", name, err)
	}
}

func (e *env) report(name string, last time.Time, inFlight int) {
	e.t.Helper()
	if err := e.store.RecordActivity(e.ctx, []store.Activity{{Space: "default", Name: name, Reporter: "router-1", LastActive: last, InFlight: inFlight}}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) sweep() {
	e.t.Helper()
	if err := e.engine.SweepIdle(e.ctx); err != nil {
		e.t.Fatalf("sweep: %v", err)
	}
}

func (e *env) hasEvent(name, prefix string) bool {
	e.t.Helper()
	events, err := e.store.Events(e.ctx, e.actor(name).GetMetadata().GetUid(), 0)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, ev := range events {
		if strings.HasPrefix(ev.Reason, prefix) {
			return true
		}
	}
	return false
}

func TestIdleSweepAppliesPolicies(t *testing.T) {
	e := newEnv(t, 4, "n1")
	c := e.fakeClock()
	e.templateWithIdle("default-policy", nil)
	e.templateWithIdle("suspend5", &torporv1.IdlePolicy{IdleSeconds: 5, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND})
	e.templateWithIdle("pause5", &torporv1.IdlePolicy{IdleSeconds: 5, Action: torporv1.IdleAction_IDLE_ACTION_PAUSE})
	e.templateWithIdle("never", &torporv1.IdlePolicy{IdleSeconds: 0})
	for _, n := range []string{"default-policy", "suspend5", "pause5", "never"} {
		e.runningOnTemplate("a-"+n, n)
	}
	// An API resume of a RUNNING actor is activity.
	c.advance(3 * time.Second)
	if _, err := e.engine.Resume(e.ctx, "default", "a-pause5", ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	c.advance(3 * time.Second)
	e.sweep()
	wantState(t, e.actor("a-suspend5"), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	wantState(t, e.actor("a-pause5"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	c.advance(3 * time.Second)
	e.sweep()
	wantState(t, e.actor("a-pause5"), torporv1.ActorState_ACTOR_STATE_PAUSED)
	wantState(t, e.actor("a-default-policy"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	c.advance(DefaultIdleSeconds * time.Second)
	e.sweep()
	wantState(t, e.actor("a-default-policy"), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	wantState(t, e.actor("a-never"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	if !e.hasEvent("a-suspend5", "idle for 6s") {
		t.Error("the suspended actor's events do not say it was idle for 6s")
	}
	e.checkPlacement()
}

func TestIdleSweepGoesByReportedActivity(t *testing.T) {
	e := newEnv(t, 1, "n1")
	c := e.fakeClock()
	e.templateWithIdle("suspend5", &torporv1.IdlePolicy{IdleSeconds: 5, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND})
	e.runningOnTemplate("a", "suspend5")
	// Active every second (as a router reports it): never idle for 5s.
	for range 8 {
		c.advance(time.Second)
		e.report("a", c.now(), 0)
		e.sweep()
	}
	wantState(t, e.actor("a"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	// A request in flight for long keeps it too.
	e.report("a", c.now(), 1)
	c.advance(8 * time.Second)
	e.sweep()
	wantState(t, e.actor("a"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	e.report("a", c.now().Add(-6*time.Second), 0)
	e.sweep()
	wantState(t, e.actor("a"), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
}

// TestIdleStopCancelledByRequestAfterClaim: a request reported after the
// idle stop read the activity, but before its claim committed, cancels
// it before the node is called.
func TestIdleStopCancelledByRequestAfterClaim(t *testing.T) {
	e := newEnv(t, 1, "n1")
	c := e.fakeClock()
	e.templateWithIdle("suspend5", &torporv1.IdlePolicy{IdleSeconds: 5, Action: torporv1.IdleAction_IDLE_ACTION_SUSPEND})
	e.runningOnTemplate("a", "suspend5")
	c.advance(6 * time.Second)
	e.engine.SetHooks(Hooks{AfterIdleClaim: func(*torporv1.Actor) { e.report("a", c.now(), 1) }})
	e.sweep()
	wantState(t, e.actor("a"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	if n := e.agents["n1"].callCount("Checkpoint"); n != 0 {
		t.Errorf("checkpointed %d times, want none", n)
	}
	if !e.hasEvent("a", "cancelled: a request arrived") {
		t.Error("no event says the stop was cancelled")
	}
	e.checkPlacement()
}

// fillPool makes n actors RUNNING on a pool of n workers, all idle for a
// minute by the time it returns.
func fillPool(e *env, c *clock, n int, template string) []string {
	var names []string
	for i := range n {
		name := fmt.Sprintf("busy-%d", i)
		e.runningOnTemplate(name, template)
		names = append(names, name)
	}
	c.advance(time.Minute)
	return names
}

func TestConcurrentResumesEvictExactlyN(t *testing.T) {
	for _, n := range []int{1, 3, 6} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			e := newEnv(t, 6, "n1")
			c := e.fakeClock()
			e.templateWithIdle("never-idle", &torporv1.IdlePolicy{})
			busy := fillPool(e, c, 6, "never-idle")
			for i := range n {
				e.createActor(fmt.Sprintf("new-%d", i))
			}
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Go(func() {
					_, err := e.engine.Resume(e.ctx, "default", fmt.Sprintf("new-%d", i), ResumeOptions{})
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("resume: %v", err)
				}
			}
			evicted := 0
			for _, name := range busy {
				if e.actor(name).GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_SUSPENDED {
					evicted++
					if !e.hasEvent(name, "evicted for default/new-") {
						t.Errorf("%s: no event says who evicted it", name)
					}
				}
			}
			if evicted != n {
				t.Errorf("%d resumes evicted %d actors", n, evicted)
			}
			for i := range n {
				wantState(t, e.actor(fmt.Sprintf("new-%d", i)), torporv1.ActorState_ACTOR_STATE_RUNNING)
			}
			e.checkPlacement()
		})
	}
}

func TestEvictionChoosesByPriorityThenLeastRecentlyActive(t *testing.T) {
	e := newEnv(t, 5, "n1")
	c := e.fakeClock()
	e.templateWithIdle("low", &torporv1.IdlePolicy{Eviction: &torporv1.EvictionPolicy{Priority: -1}})
	e.templateWithIdle("plain", &torporv1.IdlePolicy{Eviction: &torporv1.EvictionPolicy{MinIdleSeconds: 20}})
	e.templateWithIdle("pinned", &torporv1.IdlePolicy{Eviction: &torporv1.EvictionPolicy{Never: true}})
	e.runningOnTemplate("old", "plain")
	e.runningOnTemplate("serving", "plain")
	e.runningOnTemplate("pinned", "pinned")
	c.advance(time.Minute)
	e.runningOnTemplate("low", "low")
	e.runningOnTemplate("recent", "plain")
	c.advance(10 * time.Second)
	e.report("serving", c.now().Add(-time.Minute), 1)
	// low (priority -1) goes first though most recently active; then old;
	// recent is active within its 20s minimum, serving has a request in
	// flight, pinned is never evicted (and new-0 and new-1 just started).
	for i, want := range []string{"low", "old"} {
		e.createActor(fmt.Sprintf("new-%d", i))
		if _, err := e.engine.Resume(e.ctx, "default", fmt.Sprintf("new-%d", i), ResumeOptions{}); err != nil {
			t.Fatalf("resume %d: %v", i, err)
		}
		wantState(t, e.actor(want), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	}
	e.createActor("new-2")
	_, err := e.engine.Resume(e.ctx, "default", "new-2", ResumeOptions{})
	if errdefs.Code(err) != connect.CodeResourceExhausted {
		t.Fatalf("third resume: %v, want ResourceExhausted", err)
	}
	for _, want := range []string{"1 serving requests", "3 active more recently", "1 never evicted"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	for _, name := range []string{"serving", "recent", "pinned"} {
		wantState(t, e.actor(name), torporv1.ActorState_ACTOR_STATE_RUNNING)
	}
	e.checkPlacement()
}

// TestEvictedWorkerIsReservedForTheEvictingResume: another resume cannot
// take the worker an eviction freed, even between the victim's finalize
// and the evicting resume's claim.
func TestEvictedWorkerIsReservedForTheEvictingResume(t *testing.T) {
	e := newEnv(t, 1, "n1")
	c := e.fakeClock()
	e.templateWithIdle("never-idle", &torporv1.IdlePolicy{})
	fillPool(e, c, 1, "never-idle")
	e.createActor("waiting")
	e.createActor("thief")
	var thief error
	stolen := false
	e.engine.SetHooks(Hooks{BeforeResumeClaim: func(a *torporv1.Actor) {
		if a.GetMetadata().GetName() != "waiting" || stolen {
			return
		}
		stolen = true
		_, thief = e.engine.Resume(e.ctx, "default", "thief", ResumeOptions{})
	}})
	if _, err := e.engine.Resume(e.ctx, "default", "waiting", ResumeOptions{}); err != nil {
		t.Fatalf("evicting resume: %v", err)
	}
	if !stolen {
		t.Fatal("the thief never ran")
	}
	// The thief found no free worker (the one freed is reserved), and
	// nothing to evict: busy-0 was evicted, waiting just started.
	if errdefs.Code(thief) != connect.CodeResourceExhausted {
		t.Errorf("the other resume: %v, want ResourceExhausted", thief)
	}
	wantState(t, e.actor("waiting"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	wantState(t, e.actor("thief"), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	w, err := e.store.Workers().Get(e.ctx, validate.WorkerNamespace, "n1-w0")
	if err != nil {
		t.Fatal(err)
	}
	if w.GetStatus().GetReservedForActorUid() != "" {
		t.Errorf("the claimed worker is still reserved: %v", w.GetStatus())
	}
	e.checkPlacement()
}

// TestOnlyASuspendAsksForAWarmWorker: a plain suspend asks the node to
// warm the worker it frees and records it warm for the actor and its
// template; an eviction's checkpoint asks for no warm sandbox (the
// evicting actor's start would discard it) and records none.
func TestOnlyASuspendAsksForAWarmWorker(t *testing.T) {
	e := newEnv(t, 1, "n1")
	c := e.fakeClock()
	e.templateWithIdle("never-idle", &torporv1.IdlePolicy{})
	fillPool(e, c, 1, "never-idle")
	busy := e.actor("busy-0")
	e.createActor("waiting")
	var freed *torporv1.WorkerStatus
	e.engine.SetHooks(Hooks{BeforeResumeClaim: func(a *torporv1.Actor) {
		if a.GetMetadata().GetName() != "waiting" || freed != nil {
			return
		}
		w, err := e.store.Workers().Get(e.ctx, validate.WorkerNamespace, "n1-w0")
		if err != nil {
			t.Fatal(err)
		}
		freed = w.GetStatus()
	}})
	if _, err := e.engine.Resume(e.ctx, "default", "waiting", ResumeOptions{}); err != nil {
		t.Fatalf("evicting resume: %v", err)
	}
	evicted := e.agents["n1"].checkpointsOf(busy.GetMetadata().GetUid())
	if len(evicted) != 1 || evicted[0].GetWarm() {
		t.Fatalf("the eviction's checkpoint requests %v, want one not asking for a warm worker", evicted)
	}
	if freed.GetWarmActorUid() != "" || freed.GetWarmTemplateUid() != "" || freed.GetReservedForActorUid() == "" {
		t.Errorf("the evicted worker %v, want it reserved and warm for nobody", freed)
	}

	e.engine.SetHooks(Hooks{})
	waiting := e.suspend("waiting")
	suspended := e.agents["n1"].checkpointsOf(waiting.GetMetadata().GetUid())
	if len(suspended) != 1 || !suspended[0].GetWarm() {
		t.Fatalf("the suspend's checkpoint requests %v, want one asking for a warm worker", suspended)
	}
	w, err := e.store.Workers().Get(e.ctx, validate.WorkerNamespace, "n1-w0")
	if err != nil {
		t.Fatal(err)
	}
	if st := w.GetStatus(); st.GetWarmActorUid() != waiting.GetMetadata().GetUid() || st.GetWarmTemplateUid() != waiting.GetStatus().GetCurrentTemplateUid() {
		t.Errorf("the suspended worker %v, want it warm for %s and its template", st, waiting.GetMetadata().GetUid())
	}
	e.checkPlacement()
}

// TestEvictedActorComesBackExactly: the victim's next resume restores the
// snapshot its eviction wrote.
func TestEvictedActorComesBackExactly(t *testing.T) {
	e := newEnv(t, 1, "n1")
	c := e.fakeClock()
	e.templateWithIdle("never-idle", &torporv1.IdlePolicy{})
	fillPool(e, c, 1, "never-idle")
	e.createActor("new")
	if _, err := e.engine.Resume(e.ctx, "default", "new", ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	victim := e.actor("busy-0")
	snap := victim.GetStatus().GetLatestSnapshot()
	if snap == "" {
		t.Fatal("the evicted actor has no snapshot")
	}
	c.advance(time.Minute)
	if _, err := e.engine.Resume(e.ctx, "default", "busy-0", ResumeOptions{}); err != nil {
		t.Fatalf("resume the victim (evicting new in turn): %v", err)
	}
	if got := e.agents["n1"].lastRestore().GetSnapshot().GetLocation(); !strings.Contains(got, snap) {
		t.Errorf("the victim restored from %q, want its snapshot %s", got, snap)
	}
	wantState(t, e.actor("new"), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	e.checkPlacement()
}

func TestHeadroomEvictsEarly(t *testing.T) {
	e := newEnv(t, 3, "n1")
	c := e.fakeClock()
	e.engine.opts.Headroom = map[string]int{"default": 1}
	e.templateWithIdle("never-idle", &torporv1.IdlePolicy{})
	busy := fillPool(e, c, 3, "never-idle")
	e.report(busy[0], c.now(), 0) // the most recently active
	e.report(busy[2], c.now().Add(-30*time.Second), 0)
	e.sweep()
	running := 0
	for _, name := range busy {
		if e.actor(name).GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING {
			running++
		}
	}
	if running != 2 {
		t.Fatalf("%d of 3 actors still RUNNING after a sweep with headroom 1, want 2", running)
	}
	wantState(t, e.actor(busy[0]), torporv1.ActorState_ACTOR_STATE_RUNNING)
	if !e.hasEvent(busy[1], "headroom: pool default keeps 1 workers free") {
		t.Errorf("the least recently active actor's events do not say why it stopped")
	}
	// One free worker is enough: the next sweeps stop nobody.
	c.advance(time.Minute)
	e.sweep()
	e.sweep()
	if n := e.agents["n1"].callCount("Checkpoint"); n != 1 {
		t.Errorf("%d checkpoints, want 1", n)
	}
	e.checkPlacement()
}

// TestGoldenBuildEvicts: a template's golden build that finds every
// worker busy evicts an idle actor, as a resume does.
func TestGoldenBuildEvicts(t *testing.T) {
	e := newEnv(t, 1, "n1")
	c := e.fakeClock()
	e.templateWithIdle("never-idle", &torporv1.IdlePolicy{})
	if err := e.engine.BuildGoldens(e.ctx); err != nil {
		t.Fatal(err)
	}
	busy := fillPool(e, c, 1, "never-idle")
	e.templateWithIdle("later", nil)
	if err := e.engine.BuildGoldens(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.revision("later@1").GetStatus(); got.GetPhase() != torporv1.TemplatePhase_TEMPLATE_PHASE_READY {
		t.Fatalf("golden build with the only worker held by an idle actor: %v (%s), want READY", got.GetPhase(), got.GetMessage())
	}
	wantState(t, e.actor(busy[0]), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	if !e.hasEvent(busy[0], "evicted for default/golden:later@1") {
		t.Error("the evicted actor's events do not name the golden build")
	}
	e.checkPlacement()
}
