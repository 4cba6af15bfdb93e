// Package scheduler picks the worker an actor resumes on.
package scheduler

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// Request describes what the actor needs.
type Request struct {
	SandboxClass string
	// Selector must match the worker's labels; the key "pool" matches the
	// worker's pool.
	Selector map[string]string
	// RequireNode restricts the choice to one node (a paused actor's local
	// checkpoint lives there).
	RequireNode string
	// CachedOn lists nodes that hold the actor's snapshot in their cache;
	// they are preferred.
	CachedOn []string
	// WarmFor is the actor's uid: a worker reserved for it (by the
	// eviction that freed it, WorkerStatus.reserved_for_actor_uid) is
	// taken first, one kept warm for it (its sandbox made ahead,
	// WorkerStatus.warm_actor_uid) is preferred over any other, and
	// workers reserved for other actors are not taken.
	WarmFor string
	// WarmTemplate is the template uid of a restore: a worker whose
	// sandbox was made for that template (WorkerStatus.warm_template_uid)
	// serves it too. Empty for a cold boot, which only its own actor's
	// warm sandbox serves.
	WarmTemplate string
	// Now dates reservations: one older than ReservationTTL is void.
	Now time.Time
	// Claiming, when set, reports the free workers that other placements
	// of this control plane are claiming right now. They are picked last:
	// only one claim of a worker can win, so concurrent resumes that all
	// picked the same worker would all but one fail and start over.
	Claiming func(*torporv1.Worker) bool
}

// ReservationTTL is how long a worker freed by an eviction stays reserved
// for the resume that evicted its actor; a resume that gave up meanwhile
// does not keep it from the others for longer.
const ReservationTTL = 30 * time.Second

// Reserved reports whether w is reserved, at now, for an actor other than
// actorUID.
func Reserved(w *torporv1.Worker, actorUID string, now time.Time) bool {
	st := w.GetStatus()
	return st.GetReservedForActorUid() != "" && st.GetReservedForActorUid() != actorUID &&
		now.Sub(st.GetReserveTime().AsTime()) < ReservationTTL
}

// NoWorkerError says which constraint left no worker.
type NoWorkerError struct{ Reason string }

func (e *NoWorkerError) Error() string { return "no free worker: " + e.Reason }

// Pick chooses among free workers on live nodes. Candidates are filtered one
// constraint at a time so the error names the one that emptied the set.
// Workers reserved for other actors' resumes are not taken. Among the
// candidates it prefers, in order: the worker reserved for the actor, a
// worker no other placement is claiming (Request.Claiming), the worker
// kept warm for the actor
// (Request.WarmFor), a node that caches the snapshot (Request.CachedOn),
// a worker warm for the actor's template (Request.WarmTemplate), one not
// kept warm for another actor, the lowest name. So without concurrent
// claims the choice is stable (by name) and placement is predictable; concurrent
// claims spread over the free workers instead of racing for the first.
func Pick(free []*torporv1.Worker, live func(node string) bool, req Request) (*torporv1.Worker, error) {
	if len(free) == 0 {
		return nil, &NoWorkerError{Reason: "every worker is busy"}
	}
	candidates, err := Fits(free, live, req)
	if err != nil {
		return nil, err
	}
	candidates = slices.DeleteFunc(candidates, func(w *torporv1.Worker) bool { return Reserved(w, req.WarmFor, req.Now) })
	if len(candidates) == 0 {
		return nil, &NoWorkerError{Reason: fmt.Sprintf("%d free, but those that fit are reserved for resumes that evicted their actors", len(free))}
	}
	best := candidates[0]
	for _, w := range candidates[1:] {
		if better(w, best, req) {
			best = w
		}
	}
	return best, nil
}

// Fits returns the workers the actor could run on, busy or not: on a live
// node, of its sandbox class, matching its selector and required node.
// Candidates are filtered one constraint at a time so the error names
// the one that emptied the set.
func Fits(workers []*torporv1.Worker, live func(node string) bool, req Request) ([]*torporv1.Worker, error) {
	steps := []struct {
		what string
		keep func(*torporv1.Worker) bool
	}{
		{"none is on a live node that takes actors (not lost, not cordoned)", func(w *torporv1.Worker) bool { return live(w.GetSpec().GetNode()) }},
		{fmt.Sprintf("none has sandbox class %q", req.SandboxClass), func(w *torporv1.Worker) bool {
			return w.GetSpec().GetSandboxClass() == req.SandboxClass
		}},
		{fmt.Sprintf("none matches selector %s", selectorString(req.Selector)), func(w *torporv1.Worker) bool {
			return matches(w, req.Selector)
		}},
		{fmt.Sprintf("none is on node %q, which holds the actor's local checkpoint", req.RequireNode), func(w *torporv1.Worker) bool {
			return req.RequireNode == "" || w.GetSpec().GetNode() == req.RequireNode
		}},
	}
	candidates := workers
	for _, step := range steps {
		candidates = slices.DeleteFunc(slices.Clone(candidates), func(w *torporv1.Worker) bool { return !step.keep(w) })
		if len(candidates) == 0 {
			return nil, &NoWorkerError{Reason: fmt.Sprintf("%d free, but %s", len(workers), step.what)}
		}
	}
	return candidates, nil
}

func better(a, b *torporv1.Worker, req Request) bool {
	if req.WarmFor != "" {
		if ar, br := a.GetStatus().GetReservedForActorUid() == req.WarmFor, b.GetStatus().GetReservedForActorUid() == req.WarmFor; ar != br {
			return ar
		}
	}
	if req.Claiming != nil {
		if ac, bc := req.Claiming(a), req.Claiming(b); ac != bc {
			return bc
		}
	}
	if req.WarmFor != "" {
		if aw, bw := a.GetStatus().GetWarmActorUid() == req.WarmFor, b.GetStatus().GetWarmActorUid() == req.WarmFor; aw != bw {
			return aw
		}
	}
	ac, bc := slices.Contains(req.CachedOn, a.GetSpec().GetNode()), slices.Contains(req.CachedOn, b.GetSpec().GetNode())
	if ac != bc {
		return ac
	}
	if req.WarmTemplate != "" {
		if at, bt := a.GetStatus().GetWarmTemplateUid() == req.WarmTemplate, b.GetStatus().GetWarmTemplateUid() == req.WarmTemplate; at != bt {
			return at
		}
	}
	// Another actor's warm sandbox is kept for it as long as possible.
	if ao, bo := a.GetStatus().GetWarmActorUid() != "", b.GetStatus().GetWarmActorUid() != ""; ao != bo {
		return bo
	}
	return a.GetMetadata().GetName() < b.GetMetadata().GetName()
}

func matches(w *torporv1.Worker, selector map[string]string) bool {
	for k, v := range selector {
		got, ok := w.GetMetadata().GetLabels()[k]
		if k == "pool" {
			got, ok = w.GetSpec().GetPool(), true
		}
		if !ok || got != v {
			return false
		}
	}
	return true
}

func selectorString(sel map[string]string) string {
	if len(sel) == 0 {
		return "{}"
	}
	parts := make([]string, 0, len(sel))
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		parts = append(parts, k+"="+sel[k])
	}
	return strings.Join(parts, ",")
}
