package scheduler

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func TestPickHonoursReservations(t *testing.T) {
	now := time.Now()
	reserved := func(name, uid string, at time.Time) *torporv1.Worker {
		w := worker(name, "n1", "gvisor", "default", nil)
		w.Status = &torporv1.WorkerStatus{ReservedForActorUid: uid, ReserveTime: timestamppb.New(at)}
		return w
	}
	live := func(string) bool { return true }
	free := []*torporv1.Worker{
		reserved("w-a", "uid-1", now),
		reserved("w-b", "uid-2", now.Add(-time.Second)),
		reserved("w-c", "uid-3", now.Add(-ReservationTTL)),
	}
	tests := []struct {
		name, actor, want string
		free              []*torporv1.Worker
	}{
		{"the actor's own reservation first", "uid-2", "w-b", free},
		{"others' reservations are skipped; an expired one is free", "uid-9", "w-c", free},
		{"own reservation over a claim in progress", "uid-1", "w-a", free},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := Pick(tt.free, live, Request{SandboxClass: "gvisor", WarmFor: tt.actor, Now: now, Claiming: claiming("w-a")})
			if err != nil || w.GetMetadata().GetName() != tt.want {
				t.Fatalf("picked %v, %v; want %s", w.GetMetadata().GetName(), err, tt.want)
			}
		})
	}
	_, err := Pick(free[:2], live, Request{SandboxClass: "gvisor", WarmFor: "uid-9", Now: now})
	if err == nil || !strings.Contains(err.Error(), "reserved for resumes that evicted their actors") {
		t.Errorf("only others' reservations: %v, want a NoWorkerError saying so", err)
	}
}
