package e2b

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// E2B's two sandbox states.
const (
	stateRunning = "running"
	statePaused  = "paused"
)

// statesOf are the actor states an E2B state stands for: "running" is a
// sandbox that runs or is being started; "paused" is one whose workload
// is stopped (or stopping) and comes back on connect. A crashed sandbox
// is paused too: connect resumes it from its latest snapshot.
var statesOf = map[string][]torporv1.ActorState{
	stateRunning: {torporv1.ActorState_ACTOR_STATE_RUNNING, torporv1.ActorState_ACTOR_STATE_RESUMING},
	statePaused: {
		torporv1.ActorState_ACTOR_STATE_SUSPENDED, torporv1.ActorState_ACTOR_STATE_SUSPENDING,
		torporv1.ActorState_ACTOR_STATE_PAUSED, torporv1.ActorState_ACTOR_STATE_PAUSING,
		torporv1.ActorState_ACTOR_STATE_CRASHED,
	},
}

// stateOf is the E2B state of an actor state.
func stateOf(s torporv1.ActorState) string {
	switch s {
	case torporv1.ActorState_ACTOR_STATE_RUNNING, torporv1.ActorState_ACTOR_STATE_RESUMING:
		return stateRunning
	}
	return statePaused
}

// isSandbox tells an actor made through the E2B API from any other actor
// of the space: only those are sandboxes here. One being deleted is a
// killed sandbox, which E2B no longer shows.
func isSandbox(a *torporv1.Actor) bool {
	return a.GetSpec().GetSandbox() != nil && a.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_DELETING
}

// resourcesOf are the CPU count and memory (MiB) the template the actor
// runs on gives it; 0 when the template sets no limit. CPU is whole
// cores, a fraction rounded up.
func resourcesOf(a *torporv1.Actor) (cpus int32, memoryMB int64) {
	r := a.GetStatus().GetCurrentTemplateSpec().GetResources()
	return (r.GetCpuMillis() + 999) / 1000, r.GetMemoryMb()
}

func (g *Gateway) sandboxOf(a *torporv1.Actor) sandbox {
	return sandbox{
		TemplateID:      a.GetSpec().GetTemplate(),
		SandboxID:       a.GetMetadata().GetName(),
		ClientID:        a.GetStatus().GetWorker().GetNode(),
		EnvdVersion:     EnvdVersion,
		EnvdAccessToken: a.GetSpec().GetEnvdAccessToken(),
		Domain:          g.domain,
	}
}

func listedOf(a *torporv1.Actor) listedSandbox {
	cpus, mem := resourcesOf(a)
	lease := a.GetSpec().GetSandbox()
	metadata := a.GetMetadata().GetLabels()
	if metadata == nil {
		metadata = map[string]string{}
	}
	return listedSandbox{
		TemplateID:  a.GetSpec().GetTemplate(),
		SandboxID:   a.GetMetadata().GetName(),
		ClientID:    a.GetStatus().GetWorker().GetNode(),
		StartedAt:   timeOf(lease.GetStartTime()),
		EndAt:       timeOf(lease.GetEndTime()),
		CPUCount:    cpus,
		MemoryMB:    mem,
		Metadata:    metadata,
		State:       stateOf(a.GetStatus().GetState()),
		EnvdVersion: EnvdVersion,
	}
}

func (g *Gateway) detailOf(a *torporv1.Actor) sandboxDetail {
	onTimeout := "kill"
	if a.GetSpec().GetSandbox().GetAutoPause() {
		onTimeout = "pause"
	}
	d := sandboxDetail{
		listedSandbox:   listedOf(a),
		EnvdAccessToken: a.GetSpec().GetEnvdAccessToken(),
		Domain:          g.domain,
		Lifecycle:       lifecycle{AutoResume: a.GetSpec().GetSandbox().GetAutoResume(), OnTimeout: onTimeout},
	}
	d.AllowInternetAccess, d.Network = networkOf(a)
	return d
}

// timeOf is t as E2B's date-time: RFC 3339 in UTC; the zero time when
// unset.
func timeOf(t *timestamppb.Timestamp) string {
	if t == nil {
		return time.Time{}.Format(time.RFC3339Nano)
	}
	return t.AsTime().UTC().Format(time.RFC3339Nano)
}
