package workflow

import (
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
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
