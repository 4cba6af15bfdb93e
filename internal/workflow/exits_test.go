package workflow

import (
	"regexp"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/exits"
)

func TestRestartDelay(t *testing.T) {
	for _, tc := range []struct {
		restarts int32
		want     time.Duration
	}{
		{0, time.Second},
		{1, 2 * time.Second},
		{2, 4 * time.Second},
		{8, 256 * time.Second},
		{9, restartMax},
		{1000, restartMax},
	} {
		if got := restartDelay(tc.restarts); got != tc.want {
			t.Errorf("restartDelay(%d) = %s, want %s", tc.restarts, got, tc.want)
		}
	}
}

func TestRestartPolicyDecision(t *testing.T) {
	var (
		ok      = exits.New("app", 0, nil, time.Now())
		failed  = exits.New("app", 1, nil, time.Now())
		killed  = exits.New("app", 137, nil, time.Now())
		unknown = exits.Unknown("app", nil, time.Now())
	)
	if killed.GetSignal() != "SIGKILL" {
		t.Fatalf("status 137 is signal %q, want SIGKILL", killed.GetSignal())
	}
	for _, tc := range []struct {
		policy torporv1.RestartPolicy
		exit   *torporv1.ContainerExit
		want   bool
	}{
		{torporv1.RestartPolicy_RESTART_POLICY_UNSPECIFIED, ok, true},
		{torporv1.RestartPolicy_RESTART_POLICY_UNSPECIFIED, failed, true},
		{torporv1.RestartPolicy_RESTART_POLICY_ALWAYS, ok, true},
		{torporv1.RestartPolicy_RESTART_POLICY_ALWAYS, killed, true},
		{torporv1.RestartPolicy_RESTART_POLICY_ON_FAILURE, ok, false},
		{torporv1.RestartPolicy_RESTART_POLICY_ON_FAILURE, failed, true},
		{torporv1.RestartPolicy_RESTART_POLICY_ON_FAILURE, killed, true},
		{torporv1.RestartPolicy_RESTART_POLICY_ON_FAILURE, unknown, true},
		{torporv1.RestartPolicy_RESTART_POLICY_NEVER, failed, false},
		{torporv1.RestartPolicy_RESTART_POLICY_NEVER, ok, false},
	} {
		spec := &torporv1.TemplateSpec{RestartPolicy: tc.policy}
		if got := restarts(restartPolicy(spec), tc.exit); got != tc.want {
			t.Errorf("policy %s, %s: restarts %v, want %v", tc.policy, exits.Status(tc.exit), got, tc.want)
		}
	}
}

// TestReportExit: an exit crashes the actor that runs the workload and
// frees its worker (invariant 1); a report of a workload the actor no
// longer runs there changes nothing (invariant 2); a resume for traffic
// is refused while the back-off runs and goes on once it ran out, and an
// explicit one is never refused.
func TestReportExit(t *testing.T) {
	e := newEnv(t, 1, "n1")
	e.createActor("c1")
	a, err := e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, op := a.GetStatus().GetWorker(), a.GetStatus().GetRunOperation()
	if op == "" {
		t.Fatal("a RUNNING actor names no run operation")
	}
	exit := exits.New("main", 1, []string{"fatal: boom"}, time.Now())
	for _, stale := range []struct{ name, node, worker, uid, op string }{
		{"another operation", "n1", w.GetName(), a.GetMetadata().GetUid(), "op-other"},
		{"another actor", "n1", w.GetName(), "uid-other", op},
		{"an unknown worker", "n1", "n1-w9", a.GetMetadata().GetUid(), op},
	} {
		if err := e.engine.ReportExit(e.ctx, stale.node, stale.worker, stale.uid, stale.op, exit); err != nil {
			t.Fatalf("%s: %v", stale.name, err)
		}
		wantState(t, e.actor("c1"), torporv1.ActorState_ACTOR_STATE_RUNNING)
	}
	if err := e.engine.ReportExit(e.ctx, "n2", w.GetName(), a.GetMetadata().GetUid(), op, exit); err == nil {
		t.Fatal("an exit reported for another node's worker was taken")
	}

	if err := e.engine.ReportExit(e.ctx, "n1", w.GetName(), a.GetMetadata().GetUid(), op, exit); err != nil {
		t.Fatal(err)
	}
	crashed := e.actor("c1")
	wantState(t, crashed, torporv1.ActorState_ACTOR_STATE_CRASHED)
	e.checkPlacement()
	st := crashed.GetStatus()
	if st.GetRestarts() != 1 || st.GetNextRestartTime() == nil || st.GetExit().GetExitCode() != 1 {
		t.Fatalf("after the exit: restarts %d, next restart %v, exit %v", st.GetRestarts(), st.GetNextRestartTime(), st.GetExit())
	}
	if !e.hasEventMatching("c1", regexp.MustCompile(`container main exited with status 1: fatal: boom; restart 1 in 1s \(restartPolicy ALWAYS\)`)) {
		t.Fatalf("no event names the exit and the restart: %v", st.GetCrashReason())
	}
	// Reported again (an agent restarted before it heard the answer).
	if err := e.engine.ReportExit(e.ctx, "n1", w.GetName(), a.GetMetadata().GetUid(), op, exit); err != nil {
		t.Fatal(err)
	}
	if got := e.actor("c1"); got.GetMetadata().GetVersion() != crashed.GetMetadata().GetVersion() {
		t.Fatal("a repeated report changed the actor")
	}

	_, err = e.engine.Resume(e.ctx, "default", "c1", ResumeOptions{OnDemand: true})
	if detail := exits.Of(err); errdefs.Code(err) != connect.CodeUnavailable || detail.GetNextRestartTime() == nil {
		t.Fatalf("resume for traffic during the back-off: %v (detail %v), want unavailable with the restart time", err, detail)
	}
	e.engine.now = func() time.Time { return time.Now().Add(restartInitial) }
	if err := e.engine.RestartExited(e.ctx); err != nil {
		t.Fatal(err)
	}
	restarted := e.actor("c1")
	wantState(t, restarted, torporv1.ActorState_ACTOR_STATE_RUNNING)
	if restarted.GetStatus().GetExit() != nil || restarted.GetStatus().GetNextRestartTime() != nil || restarted.GetStatus().GetRestarts() != 1 {
		t.Fatalf("restarted: %v", restarted.GetStatus())
	}
}
