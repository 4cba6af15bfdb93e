package cli

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func TestActorStateShowsExitsAndFreezes(t *testing.T) {
	crashed := torporv1.ActorState_ACTOR_STATE_CRASHED
	for _, tc := range []struct {
		status *torporv1.ActorStatus
		want   string
	}{
		{&torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_RUNNING, Restarts: 2}, "RUNNING"},
		{&torporv1.ActorStatus{State: crashed}, "CRASHED"},
		{&torporv1.ActorStatus{State: crashed, Exit: &torporv1.ContainerExit{ExitCode: 1}, Restarts: 3, NextRestartTime: timestamppb.New(time.Now().Add(4200 * time.Millisecond))}, "CRASHED (exit 1, restart 3 in 4s)"},
		{&torporv1.ActorStatus{State: crashed, Exit: &torporv1.ContainerExit{ExitCode: 137, Signal: "SIGKILL"}}, "CRASHED (SIGKILL, not restarted)"},
		{&torporv1.ActorStatus{State: crashed, Exit: &torporv1.ContainerExit{StatusUnknown: true}}, "CRASHED (exited, not restarted)"},
		{&torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_RUNNING, FrozenTime: timestamppb.New(time.Now().Add(-90 * time.Second))}, "RUNNING (frozen 1m30s)"},
	} {
		if got := actorState(&torporv1.Actor{Status: tc.status}); got != tc.want {
			t.Errorf("actorState = %q, want %q", got, tc.want)
		}
	}
}

func TestActorURL(t *testing.T) {
	for _, tc := range []struct {
		router, domain, want string
	}{
		{"http://127.0.0.1:7080", "actors.localhost", "http://c1.team.actors.localhost:7080/"},
		{"https://router.example.com", "actors.example.com", "https://c1.team.actors.example.com/"},
		{"https://router.example.com:8443/", "a.example", "https://c1.team.a.example:8443/"},
		{"", "actors.localhost", "http://c1.team.actors.localhost/"},
	} {
		if got := actorURL(tc.router, tc.domain, "team", "c1"); got != tc.want {
			t.Errorf("actorURL(%q, %q) = %q, want %q", tc.router, tc.domain, got, tc.want)
		}
	}
}
