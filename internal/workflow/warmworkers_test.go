package workflow

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// templateWithWarm creates template name wanting n warm workers, its
// golden built, and returns its revision's uid.
func (e *env) templateWithWarm(name string, n int32) string {
	e.t.Helper()
	e.createTemplateSpec(name, &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers:   []*torporv1.Container{{Name: "main", Image: "img"}},
		WarmWorkers:  n,
	}, torporv1.FromData_FROM_DATA_GOLDEN)
	if err := e.engine.BuildGoldens(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	rev := e.revision(name + "@1")
	if rev.GetStatus().GetPhase() != torporv1.TemplatePhase_TEMPLATE_PHASE_READY {
		e.t.Fatalf("template %s: %v, want READY", name, rev.GetStatus())
	}
	return rev.GetMetadata().GetUid()
}

// warmFor returns, by template uid, the free workers marked warm for it.
func (e *env) warmFor() map[string][]string {
	e.t.Helper()
	workers, err := store.ListAll(e.ctx, e.store.Workers(), store.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string][]string{}
	for _, w := range workers {
		t := w.GetStatus().GetWarmTemplateUid()
		if t == "" {
			continue
		}
		if w.GetStatus().GetActor() != nil {
			e.t.Errorf("busy worker %s marked warm for template %s", w.GetMetadata().GetName(), t)
		}
		out[t] = append(out[t], w.GetMetadata().GetName())
	}
	return out
}

// createActorOn creates actor name, SUSPENDED, on revision 1 of template.
func (e *env) createActorOn(name, template string) {
	e.t.Helper()
	if _, err := e.store.Actors().Create(e.ctx, &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: name},
		Spec:     &torporv1.ActorSpec{Template: template, TemplateRevision: 1},
		Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED},
	}); err != nil {
		e.t.Fatal(err)
	}
}

// TestWarmWorkersKeptForTemplates: the sweep has as many free workers
// warmed for a template as it asks for, once; a new actor's first resume
// takes one of them (and its history says it started warm), and the next
// sweep warms another in its place. A busy worker is never warmed, and no
// actor is evicted for warmth.
func TestWarmWorkersKeptForTemplates(t *testing.T) {
	e := newEnv(t, 4, "n1")
	hot := e.templateWithWarm("hot", 2)
	e.sweep()
	warm := e.warmFor()
	if got := warm[hot]; len(got) != 2 {
		t.Fatalf("warm for hot after a sweep: %v, want 2 workers", got)
	}
	agent := e.agents["n1"]
	if n := agent.callCount("Warm"); n != 2 {
		t.Fatalf("%d Warm calls, want 2", n)
	}
	e.sweep()
	if n := agent.callCount("Warm"); n != 2 {
		t.Fatalf("%d Warm calls after a second sweep, want still 2", n)
	}

	e.createActorOn("new", "hot")
	a := e.resume("new", ResumeOptions{})
	if got := a.GetStatus().GetWorker().GetName(); got != warm[hot][0] {
		t.Fatalf("the new actor runs on %s, want %s, warm for its template", got, warm[hot][0])
	}
	if !e.hasEvent("new", "resumed (DATA_ON_GOLDEN, into a warm sandbox)") {
		t.Error("the new actor's history does not say it started in a warm sandbox")
	}
	e.sweep()
	if got := e.warmFor()[hot]; len(got) != 2 {
		t.Fatalf("warm for hot after the resume and a sweep: %v, want 2 again", got)
	}

	// Every other worker busy: nothing to warm, nobody evicted.
	for _, name := range []string{"b1", "b2", "b3"} {
		e.createActorOn(name, "hot")
		e.resume(name, ResumeOptions{})
	}
	before := agent.callCount("Warm")
	e.sweep()
	if n := agent.callCount("Warm"); n != before {
		t.Fatalf("%d Warm calls with every worker busy", n-before)
	}
	for _, name := range []string{"new", "b1", "b2", "b3"} {
		wantState(t, e.actor(name), torporv1.ActorState_ACTOR_STATE_RUNNING)
	}
	e.checkPlacement()
}

// TestWarmWorkersTakeOverSurplus: with no cold free worker, a template
// that wants a warm worker takes over one warm for a template that wants
// fewer (here, one an actor of it left warm), never one its own template
// still wants.
func TestWarmWorkersTakeOverSurplus(t *testing.T) {
	e := newEnv(t, 2, "n1")
	e.templateWithIdle("plain", nil)
	e.runningOnTemplate("left", "plain")
	e.suspend("left")
	plain := e.revision("plain@1").GetMetadata().GetUid()
	hot := e.templateWithWarm("hot", 2)
	e.sweep()
	warm := e.warmFor()
	if len(warm[hot]) != 2 || len(warm[plain]) != 0 {
		t.Fatalf("warm workers: %v, want both for hot (%s), none left for plain (%s)", warm, hot, plain)
	}
	// Both now wanted by hot: a second template gets none of them.
	e.templateWithWarm("second", 1)
	e.sweep()
	if got := e.warmFor(); len(got[hot]) != 2 {
		t.Fatalf("warm workers after a second template: %v, want hot's two kept", got)
	}
}

// TestConcurrentSweepsWarmEnough: replicas sweeping at once warm at least
// what templates ask for, mark only free workers, and agree afterwards:
// a later sweep warms nothing more.
func TestConcurrentSweepsWarmEnough(t *testing.T) {
	e := newEnv(t, 6, "n1")
	hot := e.templateWithWarm("hot", 2)
	other := e.templateWithWarm("other", 1)
	replicas := []*Engine{e.engine}
	for range 3 {
		replicas = append(replicas, New(e.store, e.agents, e.objects, Options{HeartbeatTimeout: time.Minute}, slog.New(slog.DiscardHandler)))
	}
	var wg sync.WaitGroup
	for _, r := range replicas {
		wg.Go(func() {
			if err := r.SweepIdle(context.Background()); err != nil {
				t.Errorf("sweep: %v", err)
			}
		})
	}
	wg.Wait()
	warm := e.warmFor()
	if len(warm[hot]) < 2 || len(warm[other]) < 1 {
		t.Fatalf("warm workers after concurrent sweeps: %v, want at least 2 for hot, 1 for other", warm)
	}
	calls := e.agents["n1"].callCount("Warm")
	e.sweep()
	if n := e.agents["n1"].callCount("Warm"); n != calls {
		t.Fatalf("a sweep after the concurrent ones warmed %d more", n-calls)
	}
	w, err := e.store.Workers().Get(e.ctx, validate.WorkerNamespace, warm[hot][0])
	if err != nil || w.GetStatus().GetWarmActorUid() != "" {
		t.Fatalf("worker warmed for a template still names an actor: %v, %v", w.GetStatus(), err)
	}
}
