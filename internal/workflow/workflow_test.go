package workflow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

type env struct {
	t       *testing.T
	ctx     context.Context
	store   store.Store
	agents  fakeAgents
	objects *fakeObjects
	engine  *Engine
}

// envStoreURL names the store newEnv opens: a fresh SQLite file, unless
// a test runs the workflows over another backend (postgres_test.go).
var envStoreURL = func(t *testing.T) string { return "sqlite:" + filepath.Join(t.TempDir(), "torpor.db") }

// newEnv opens a real store (SQLite, see envStoreURL) with the counter
// template, and nodes with workers each served by a fake agent.
func newEnv(t *testing.T, workersPerNode int, nodes ...string) *env {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, envStoreURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, ctx: ctx, store: st, agents: fakeAgents{}, objects: &fakeObjects{}}
	e.engine = New(st, e.agents, e.objects, Options{HeartbeatTimeout: time.Minute}, slog.New(slog.DiscardHandler))
	for _, n := range nodes {
		e.addNode(n, workersPerNode)
	}
	e.createTemplate("counter", torporv1.FromData_FROM_DATA_COLD_BOOT)
	return e
}

func (e *env) addNode(name string, workers int) {
	e.agents[name] = newFakeAgent(name)
	if _, err := e.store.Nodes().Create(e.ctx, &torporv1.Node{Metadata: &torporv1.ObjectMeta{Name: name}, Address: "fake", HeartbeatTime: timestamppb.Now()}); err != nil {
		e.t.Fatal(err)
	}
	for i := range workers {
		if _, err := e.store.Workers().Create(e.ctx, &torporv1.Worker{
			Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: fmt.Sprintf("%s-w%d", name, i)},
			Spec:     &torporv1.WorkerSpec{Node: name, Ip: fmt.Sprintf("10.0.0.%d", i+2), Pool: "default", SandboxClass: "gvisor"},
			Status:   &torporv1.WorkerStatus{},
		}); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) createTemplate(name string, fromData torporv1.FromData) *torporv1.Template {
	return e.createTemplateSpec(name, &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers:   []*torporv1.Container{{Name: "main", Image: "img"}},
	}, fromData)
}

// revision reads a template revision's record ("NAME@REV").
func (e *env) revision(name string) *torporv1.Template {
	e.t.Helper()
	r, err := e.store.Revisions().Get(e.ctx, "default", name)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

func (e *env) createActor(name string) *torporv1.Actor {
	a, err := e.store.Actors().Create(e.ctx, &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: name},
		Spec:     &torporv1.ActorSpec{Template: "counter", TemplateRevision: 1},
		Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

func (e *env) actor(name string) *torporv1.Actor {
	a, err := e.store.Actors().Get(e.ctx, "default", name)
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

// checkPlacement pins invariant 1 over the whole store: actor.worker = W
// exactly when W.actor = actor.
func (e *env) checkPlacement() {
	e.t.Helper()
	workers, err := store.ListAll(e.ctx, e.store.Workers(), store.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	actors, err := store.ListAll(e.ctx, e.store.Actors(), store.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	byUID := map[string]*torporv1.Actor{}
	for _, a := range actors {
		byUID[a.GetMetadata().GetUid()] = a
		if ref := a.GetStatus().GetWorker(); ref != nil {
			w, err := e.store.Workers().Get(e.ctx, ref.GetNamespace(), ref.GetName())
			if err != nil || w.GetStatus().GetActor().GetUid() != a.GetMetadata().GetUid() {
				e.t.Fatalf("actor %s names worker %s, which does not name it back (%v)", a.GetMetadata().GetName(), ref.GetName(), w.GetStatus())
			}
		}
		if inFlight(a.GetStatus().GetState()) && a.GetStatus().GetOperation() == nil {
			e.t.Fatalf("actor %s is %v without an operation", a.GetMetadata().GetName(), a.GetStatus().GetState())
		}
	}
	for _, w := range workers {
		ref := w.GetStatus().GetActor()
		if ref.GetUid() == "" || len(ref.GetName()) > len(goldenActorPrefix) && ref.GetName()[:len(goldenActorPrefix)] == goldenActorPrefix {
			continue
		}
		a := byUID[ref.GetUid()]
		if a == nil || a.GetStatus().GetWorker().GetUid() != w.GetMetadata().GetUid() {
			e.t.Fatalf("worker %s names actor %s, which does not name it back", w.GetMetadata().GetName(), ref.GetName())
		}
	}
}

func wantState(t *testing.T, a *torporv1.Actor, want torporv1.ActorState) {
	t.Helper()
	if got := a.GetStatus().GetState(); got != want {
		t.Fatalf("actor %s is %v, want %v (crash reason %q)", a.GetMetadata().GetName(), got, want, a.GetStatus().GetCrashReason())
	}
}

func TestResumeSuspendCycle(t *testing.T) {
	e := newEnv(t, 2, "n1")
	e.createActor("c1")
	a, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_RUNNING)
	if e.agents["n1"].callCount("Run") != 1 {
		t.Fatalf("a fresh actor without golden cold-boots once: calls %v", e.agents["n1"].calls)
	}
	e.checkPlacement()

	// Resume of a RUNNING actor does not write.
	again, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if err != nil || again.GetMetadata().GetVersion() != a.GetMetadata().GetVersion() {
		t.Fatalf("resume of a running actor wrote: %v -> %v (%v)", a.GetMetadata().GetVersion(), again.GetMetadata().GetVersion(), err)
	}

	s, err := e.engine.Suspend(e.ctx, "default", "c1")
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, s, torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	if s.GetStatus().GetWorker() != nil || s.GetStatus().GetLatestSnapshot() == "" {
		t.Fatalf("suspended actor: %v", s.GetStatus())
	}
	snap, err := e.store.Snapshots().Get(e.ctx, "default", s.GetStatus().GetLatestSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	tmpl := e.revision("counter@1")
	if snap.GetTemplateUid() != tmpl.GetMetadata().GetUid() || snap.GetTemplateSpec() == nil {
		t.Fatalf("snapshot does not record the booted template (invariant 8): %v", snap)
	}
	e.checkPlacement()

	r, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, r, torporv1.ActorState_ACTOR_STATE_RUNNING)
	if e.agents["n1"].callCount("Restore") != 1 {
		t.Fatalf("resume after suspend restores: %v", e.agents["n1"].calls)
	}
	events, err := e.store.Events(e.ctx, r.GetMetadata().GetUid(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 6 {
		t.Fatalf("want 6 history entries (3 steps x intent+done), got %d: %+v", len(events), events)
	}
}

// TestCrashDuringResumeIsNotOverwritten pins invariant 2: a crash recorded
// while the node restores must not be overwritten by RUNNING.
func TestCrashDuringResumeIsNotOverwritten(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	e.engine.SetHooks(Hooks{BeforeResumeFinalize: func(a *torporv1.Actor) {
		w, err := e.store.Workers().Get(e.ctx, a.GetStatus().GetWorker().GetNamespace(), a.GetStatus().GetWorker().GetName())
		if err != nil {
			t.Error(err)
			return
		}
		if err := e.engine.CrashWorkerActor(e.ctx, w, "worker lost in test"); err != nil {
			t.Error(err)
		}
	}})
	_, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if errdefs.Code(err) != connect.CodeAborted {
		t.Fatalf("resume over a recorded crash: %v, want Aborted", err)
	}
	a := e.actor("c1")
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_CRASHED)
	if e.agents["n1"].slots["n1-w0"] != "" {
		t.Fatal("the workload the crashed actor no longer owns was not terminated")
	}
	e.checkPlacement()

	// CRASHED is never a dead end.
	e.engine.SetHooks(Hooks{})
	r, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, r, torporv1.ActorState_ACTOR_STATE_RUNNING)
}

// TestRecoverFinishesStepsInFlight pins invariant 3: a control plane that
// stopped between intent and finalize leaves nothing stuck.
func TestRecoverFinishesStepsInFlight(t *testing.T) {
	tests := []struct {
		name   string
		prep   func(e *env)
		cutAt  func(e *env, stop func())
		action func(e *env) error
		want   torporv1.ActorState
	}{
		{
			name: "resume cut after intent",
			cutAt: func(e *env, stop func()) {
				e.engine.SetHooks(Hooks{AfterResumeClaim: func(*torporv1.Actor) { stop() }})
			},
			action: func(e *env) error { _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); return err },
			want:   torporv1.ActorState_ACTOR_STATE_RUNNING,
		},
		{
			name: "resume cut after the node restored",
			cutAt: func(e *env, stop func()) {
				e.engine.SetHooks(Hooks{BeforeResumeFinalize: func(*torporv1.Actor) { stop() }})
			},
			action: func(e *env) error { _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); return err },
			want:   torporv1.ActorState_ACTOR_STATE_RUNNING,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 2, "n1")
			e.createActor("c1")
			// The "dying" control plane stops at the cut: its goroutine
			// never returns, like a process killed there.
			died := make(chan struct{})
			tt.cutAt(e, func() { close(died); select {} })
			go tt.action(e) //nolint:errcheck // this control plane never returns
			<-died
			if st := e.actor("c1").GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_RESUMING {
				t.Fatalf("at the cut the actor is %v, want RESUMING", st)
			}
			// A new control plane over the same store and nodes.
			fresh := New(e.store, e.agents, e.objects, Options{HeartbeatTimeout: time.Minute}, slog.New(slog.DiscardHandler))
			if err := fresh.Recover(e.ctx, 0); err != nil {
				t.Fatal(err)
			}
			wantState(t, e.actor("c1"), tt.want)
			if n := e.agents["n1"].callCount("Run"); n != 1 {
				t.Fatalf("the workload ran %d times, want once", n)
			}
			e.checkPlacement()
		})
	}
}

func TestRestoreFailureCrashesWithItsCode(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	first, err := e.engine.Suspend(e.ctx, "default", "c1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.engine.Suspend(e.ctx, "default", "c1"); err != nil {
		t.Fatal(err)
	}
	e.agents["n1"].failRestore = connect.NewError(connect.CodeDataLoss, errors.New("snapshot x: file pages.img: sha256 mismatch"))
	_, err = e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if errdefs.Code(err) != connect.CodeDataLoss {
		t.Fatalf("resume of a corrupt snapshot: %v, want DataLoss", err)
	}
	a := e.actor("c1")
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_CRASHED)
	e.checkPlacement()
	// The kept earlier snapshot restores when asked for.
	r, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{Snapshot: first.GetStatus().GetLatestSnapshot()})
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, r, torporv1.ActorState_ACTOR_STATE_RUNNING)
}

func TestNoFreeWorker(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	e.createActor("c2")
	if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := e.engine.Resume(e.ctx, "default", "c2", ResumeOptions{})
	if errdefs.Code(err) != connect.CodeResourceExhausted {
		t.Fatalf("got %v, want ResourceExhausted", err)
	}
	wantState(t, e.actor("c2"), torporv1.ActorState_ACTOR_STATE_SUSPENDED)
}

func TestConcurrentResumesRunOnce(t *testing.T) {
	e := newEnv(t, 4, "n1")
	e.createActor("c1")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := e.agents["n1"].callCount("Run"); n != 1 {
		t.Fatalf("8 concurrent resumes booted %d times", n)
	}
	e.checkPlacement()
}

func TestPauseResumesOnSameNode(t *testing.T) {
	e := newEnv(t, 1, "n1", "n2")
	e.createActor("c1")
	a, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node := a.GetStatus().GetWorker().GetNode()
	p, err := e.engine.Pause(e.ctx, "default", "c1")
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, p, torporv1.ActorState_ACTOR_STATE_PAUSED)
	// Another actor takes a worker on the other node, so placement is not
	// trivially the same node.
	r, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.GetStatus().GetWorker().GetNode() != node {
		t.Fatalf("resumed on %s, the local checkpoint is on %s", r.GetStatus().GetWorker().GetNode(), node)
	}
	if r.GetStatus().GetLocalCheckpoint() != "" {
		t.Fatal("the consumed local checkpoint is still referenced")
	}
}

func TestLostNodeCrashesItsActors(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
		t.Fatal(err)
	}
	n, _ := e.store.Nodes().Get(e.ctx, "", "n1")
	n.HeartbeatTime = timestamppb.New(time.Now().Add(-2 * time.Minute))
	if _, err := e.store.Nodes().Update(e.ctx, n); err != nil {
		t.Fatal(err)
	}
	if err := e.engine.CheckNodes(e.ctx); err != nil {
		t.Fatal(err)
	}
	a := e.actor("c1")
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_CRASHED)
	e.checkPlacement()
	_, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if errdefs.Code(err) != connect.CodeResourceExhausted {
		t.Fatalf("resume with only a dead node: %v", err)
	}
}

func TestRetentionKeepsLastK(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	for range 4 {
		if _, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.engine.Suspend(e.ctx, "default", "c1"); err != nil {
			t.Fatal(err)
		}
	}
	a := e.actor("c1")
	snaps, err := e.engine.actorSnapshots(e.ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 2 || snaps[1].GetMetadata().GetName() != a.GetStatus().GetLatestSnapshot() {
		t.Fatalf("kept %d snapshots, want the latest 2", len(snaps))
	}
	if len(e.objects.deleted) != 2 {
		t.Fatalf("removed files of %d snapshots, want 2", len(e.objects.deleted))
	}
	if err := e.engine.Delete(e.ctx, "default", "c1", DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(e.objects.deleted) != 4 {
		t.Fatalf("deleting the actor removed %d snapshots in all, want 4", len(e.objects.deleted))
	}
	if _, err := e.store.Actors().Get(e.ctx, "default", "c1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted actor still there: %v", err)
	}
}

// TestResumePrefersTheNodeThatWroteTheSnapshot: that node has the snapshot
// in its cache, so a resume lands there when it has a free worker.
func TestResumePrefersTheNodeThatWroteTheSnapshot(t *testing.T) {
	e := newEnv(t, 1, "n1", "n2")
	e.createActor("blocker")
	e.createActor("c1")
	e.resume("blocker", ResumeOptions{}) // takes n1-w0, the first by name
	if got := e.resume("c1", ResumeOptions{}).GetStatus().GetWorker().GetNode(); got != "n2" {
		t.Fatalf("c1 landed on %s, want n2", got)
	}
	e.suspend("c1")
	e.suspend("blocker") // n1-w0, first by name, is free again
	if got := e.resume("c1", ResumeOptions{}).GetStatus().GetWorker().GetNode(); got != "n2" {
		t.Fatalf("resumed on %s, want n2 which wrote (and caches) the snapshot", got)
	}
}

// TestResumePrefersTheWorkerKeptWarm: a suspend leaves its worker marked
// warm for the actor (its node keeps a sandbox ready there); the actor's
// next resume takes that worker over a lower-named one on the same node,
// and whoever takes the worker clears the mark.
func TestResumePrefersTheWorkerKeptWarm(t *testing.T) {
	e := newEnv(t, 2, "n1")
	e.createActor("blocker")
	e.createActor("c1")
	e.resume("blocker", ResumeOptions{}) // n1-w0
	if got := e.resume("c1", ResumeOptions{}).GetStatus().GetWorker().GetName(); got != "n1-w1" {
		t.Fatalf("c1 landed on %s, want n1-w1", got)
	}
	e.suspend("c1")
	e.suspend("blocker") // n1-w0, first by name, is free again
	warm := func(name string) string {
		t.Helper()
		w, err := e.store.Workers().Get(e.ctx, validate.WorkerNamespace, name)
		if err != nil {
			t.Fatal(err)
		}
		return w.GetStatus().GetWarmActorUid()
	}
	if got, want := warm("n1-w1"), e.actor("c1").GetMetadata().GetUid(); got != want {
		t.Fatalf("n1-w1 is warm for %q after c1's suspend, want c1 (%s)", got, want)
	}
	if got := e.resume("c1", ResumeOptions{}).GetStatus().GetWorker().GetName(); got != "n1-w1" {
		t.Fatalf("c1 resumed on %s, want n1-w1, kept warm for it", got)
	}
	if got := warm("n1-w1"); got != "" {
		t.Errorf("n1-w1 still marked warm for %q while c1 runs on it", got)
	}
	e.checkPlacement()
}

// TestStepsRecordTheirPhases: the event of a resume says how long its
// claim and its node call took and the node's steps, in the node's order;
// a cold boot, whose node call reports no steps, says the first two. The
// event of a suspend says the node's steps.
func TestStepsRecordTheirPhases(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	e.resume("c1", ResumeOptions{})
	boot := regexp.MustCompile(`^resumed \(BOOT\); claim [0-9]+\.[0-9]ms, node [0-9]+\.[0-9]ms$`)
	if !e.hasEventMatching("c1", boot) {
		t.Errorf("no event matches %s: %v", boot, e.reasons("c1"))
	}
	e.suspend("c1")
	suspended := regexp.MustCompile(`^SUSPENDED: FULL snapshot \S+ \(1 bytes\); node capture 120\.0ms, upload 410\.0ms$`)
	if !e.hasEventMatching("c1", suspended) {
		t.Errorf("no event matches %s: %v", suspended, e.reasons("c1"))
	}
	e.resume("c1", ResumeOptions{})
	restore := regexp.MustCompile(`^resumed \(FULL\); claim [0-9]+\.[0-9]ms, node [0-9]+\.[0-9]ms \(fetch 1\.3ms, start 70\.0ms\)$`)
	if !e.hasEventMatching("c1", restore) {
		t.Errorf("no event matches %s: %v", restore, e.reasons("c1"))
	}
}

func (e *env) hasEventMatching(name string, re *regexp.Regexp) bool {
	e.t.Helper()
	evs, err := e.store.Events(e.ctx, e.actor(name).GetMetadata().GetUid(), 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.ContainsFunc(evs, func(ev store.Event) bool { return re.MatchString(ev.Reason) })
}

// TestConcurrentResumesClaimDifferentWorkers: a resume that picks its
// worker while another resume of this engine is claiming one picks another,
// so neither loses its claim and starts over. Without concurrency the
// choice stays the lowest name.
func TestConcurrentResumesClaimDifferentWorkers(t *testing.T) {
	e := newEnv(t, 2, "n1")
	e.createActor("c1")
	e.createActor("c2")
	claims := map[string]int{}
	var inner *torporv1.Actor
	e.engine.SetHooks(Hooks{BeforeResumeClaim: func(a *torporv1.Actor) {
		claims[a.GetMetadata().GetName()]++
		if a.GetMetadata().GetName() != "c1" || inner != nil {
			return
		}
		// c1 has picked its worker and not committed the claim yet.
		var err error
		if inner, err = e.engine.Resume(e.ctx, "default", "c2", ResumeOptions{}); err != nil {
			t.Errorf("resume c2 during c1's claim: %v", err)
		}
	}})
	c1, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c1.GetStatus().GetWorker().GetName(); got != "n1-w0" {
		t.Errorf("c1 runs on %s, want n1-w0 (lowest name, picked first)", got)
	}
	if got := inner.GetStatus().GetWorker().GetName(); got != "n1-w1" {
		t.Errorf("c2 runs on %s, want n1-w1 (n1-w0 was being claimed by c1)", got)
	}
	if claims["c1"] != 1 || claims["c2"] != 1 {
		t.Errorf("claim attempts %v, want one each", claims)
	}
	e.checkPlacement()
}

// TestResumeFinalizesOverAnUnrelatedWrite: the finalize compare-and-sets
// the actor as claimed; when another write changed it meanwhile without
// touching the step, the finalize reads it again and still completes,
// keeping that write.
func TestResumeFinalizesOverAnUnrelatedWrite(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	e.engine.SetHooks(Hooks{BeforeResumeFinalize: func(a *torporv1.Actor) {
		cur, err := e.store.Actors().Get(e.ctx, "default", "c1")
		if err != nil {
			t.Error(err)
			return
		}
		cur.Metadata.Labels = map[string]string{"touched": "yes"}
		if _, err := e.store.Actors().Update(e.ctx, cur); err != nil {
			t.Error(err)
		}
	}})
	a, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_RUNNING)
	if got := e.actor("c1").GetMetadata().GetLabels()["touched"]; got != "yes" {
		t.Fatalf("the finalize overwrote a concurrent write: labels %v", e.actor("c1").GetMetadata().GetLabels())
	}
	e.checkPlacement()
}

// TestSuspendFinalizesOverAnUnrelatedWrite: like a resume's, a suspend's
// finalize that finds the actor changed without touching the step reads
// it again and completes, keeping that write; the snapshot and the worker's
// release commit with it.
func TestSuspendFinalizesOverAnUnrelatedWrite(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	e.resume("c1", ResumeOptions{})
	e.engine.SetHooks(Hooks{BeforeCheckpointFinalize: func(a *torporv1.Actor) {
		cur, err := e.store.Actors().Get(e.ctx, "default", "c1")
		if err != nil {
			t.Error(err)
			return
		}
		cur.Metadata.Labels = map[string]string{"touched": "yes"}
		if _, err := e.store.Actors().Update(e.ctx, cur); err != nil {
			t.Error(err)
		}
	}})
	s, err := e.engine.Suspend(e.ctx, "default", "c1")
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, s, torporv1.ActorState_ACTOR_STATE_SUSPENDED)
	a := e.actor("c1")
	if got := a.GetMetadata().GetLabels()["touched"]; got != "yes" {
		t.Fatalf("the finalize overwrote a concurrent write: labels %v", a.GetMetadata().GetLabels())
	}
	if _, err := e.store.Snapshots().Get(e.ctx, "default", a.GetStatus().GetLatestSnapshot()); err != nil {
		t.Fatalf("the snapshot the actor points at: %v", err)
	}
	e.checkPlacement()
}

// TestCrashDuringSuspendIsNotOverwritten pins invariant 2 for a suspend:
// a crash recorded while the node checkpoints is not overwritten by
// SUSPENDED, and nothing of the finalize is written (no snapshot record).
func TestCrashDuringSuspendIsNotOverwritten(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	e.resume("c1", ResumeOptions{})
	e.engine.SetHooks(Hooks{BeforeCheckpointFinalize: func(a *torporv1.Actor) {
		w, err := e.store.Workers().Get(e.ctx, a.GetStatus().GetWorker().GetNamespace(), a.GetStatus().GetWorker().GetName())
		if err != nil {
			t.Error(err)
			return
		}
		if err := e.engine.CrashWorkerActor(e.ctx, w, "worker lost in test"); err != nil {
			t.Error(err)
		}
	}})
	_, err := e.engine.Suspend(e.ctx, "default", "c1")
	if errdefs.Code(err) != connect.CodeAborted {
		t.Fatalf("suspend over a recorded crash: %v, want Aborted", err)
	}
	a := e.actor("c1")
	wantState(t, a, torporv1.ActorState_ACTOR_STATE_CRASHED)
	if snaps, err := e.engine.actorSnapshots(e.ctx, a); err != nil || len(snaps) != 0 {
		t.Fatalf("snapshots after a suspend that lost to a crash: %v, %v; want none", snaps, err)
	}
	e.checkPlacement()
}
