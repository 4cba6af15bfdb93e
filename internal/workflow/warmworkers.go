package workflow

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/scheduler"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// warmRequester is a node agent that warms a free worker for a
// template's next actor (NodeAgentService.Warm).
type warmRequester interface {
	Warm(context.Context, *connect.Request[torporv1.WarmRequest]) (*connect.Response[torporv1.WarmResponse], error)
}

// keepWarm keeps, for the latest revision of every template that asks
// for warm workers (TemplateSpec.warm_workers), that many free workers
// on live nodes warm for it: it asks their nodes to warm free workers
// warm for no template, or for one that has more than it wants, and
// records the template on each (WorkerStatus.warm_template_uid), which
// placement prefers for the template's restores. A worker left warm by
// an actor of the template counts: any actor of the template restores
// into it. Only free workers are used; nothing is evicted for warmth
// (keepHeadroom, run before, is what frees workers ahead of demand).
// Replicas sweeping at once may warm a worker more than asked; the
// surplus is taken over by the next template that wants one.
//
// A node that does not warm (it runs with warming off) or fails to
// costs only the speed of the next restore there: its error is logged,
// not returned.
func (e *Engine) keepWarm(ctx context.Context) error {
	revisions, err := store.ListAll(ctx, e.store.Revisions(), store.ListOptions{})
	if err != nil {
		return err
	}
	latest := map[string]*torporv1.Template{}
	for _, r := range revisions {
		key := r.GetMetadata().GetSpace() + "/" + validate.TemplateOfRevision(r.GetMetadata().GetName())
		if cur := latest[key]; cur == nil || r.GetStatus().GetRevision() > cur.GetStatus().GetRevision() {
			latest[key] = r
		}
	}
	want := map[string]int{}
	var wanting []*torporv1.Template
	for _, r := range latest {
		if n := r.GetSpec().GetWarmWorkers(); n > 0 {
			want[r.GetMetadata().GetUid()] = int(n)
			wanting = append(wanting, r)
		}
	}
	if len(wanting) == 0 {
		return nil
	}
	slices.SortFunc(wanting, func(a, b *torporv1.Template) int {
		return cmp.Or(cmp.Compare(a.GetMetadata().GetSpace(), b.GetMetadata().GetSpace()), cmp.Compare(a.GetMetadata().GetName(), b.GetMetadata().GetName()))
	})
	free, err := e.freeWorkers(ctx)
	if err != nil {
		return err
	}
	live, err := e.placeableNodes(ctx)
	if err != nil {
		return err
	}
	now := e.now()
	free = slices.DeleteFunc(free, func(w *torporv1.Worker) bool {
		return !live(w.GetSpec().GetNode()) || scheduler.Reserved(w, "", now)
	})
	have := map[string]int{}
	for _, w := range free {
		if t := w.GetStatus().GetWarmTemplateUid(); t != "" {
			have[t]++
		}
	}
	// spare says whether w may be warmed for another template: it is warm
	// for none, or for one that has more warm workers than it wants.
	spare := func(w *torporv1.Worker) bool {
		t := w.GetStatus().GetWarmTemplateUid()
		return t == "" || have[t] > want[t]
	}
	var errs []error
	for _, t := range wanting {
		uid := t.GetMetadata().GetUid()
		for have[uid] < want[uid] {
			i := e.pickSpare(free, t, spare)
			if i < 0 {
				break
			}
			w := free[i]
			free = slices.Delete(free, i, i+1)
			prev := w.GetStatus().GetWarmTemplateUid()
			warmed, err := e.warmWorker(ctx, w, t)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if warmed {
				if prev != "" {
					have[prev]--
				}
				have[uid]++
			}
		}
	}
	return errors.Join(errs...)
}

// pickSpare returns the index of the free worker to warm for t: one of
// its sandbox class that spare allows, warm for no template before one
// taken over from another, then by name; -1 if there is none.
func (e *Engine) pickSpare(free []*torporv1.Worker, t *torporv1.Template, spare func(*torporv1.Worker) bool) int {
	best := -1
	for i, w := range free {
		if w.GetSpec().GetSandboxClass() != t.GetSpec().GetSandboxClass() || !spare(w) {
			continue
		}
		if best < 0 || better(w, free[best]) {
			best = i
		}
	}
	return best
}

// better orders spare workers: cold first (no warm sandbox is lost),
// then by name, so the choice is stable.
func better(a, b *torporv1.Worker) bool {
	if ac, bc := a.GetStatus().GetWarmTemplateUid() == "", b.GetStatus().GetWarmTemplateUid() == ""; ac != bc {
		return ac
	}
	return a.GetMetadata().GetName() < b.GetMetadata().GetName()
}

// warmWorker asks w's node to warm it for t's next actor, then records
// that on w if it is still free and unchanged. It reports whether the
// worker now counts as warm for t. A node that cannot warm is logged.
func (e *Engine) warmWorker(ctx context.Context, w *torporv1.Worker, t *torporv1.Template) (bool, error) {
	log := e.log.With("worker", w.GetMetadata().GetName(), "template", t.GetMetadata().GetSpace()+"/"+t.GetMetadata().GetName())
	agent, err := e.agents.Agent(ctx, w.GetSpec().GetNode())
	if err != nil {
		log.Debug("worker not warmed", "err", err)
		return false, nil
	}
	wr, ok := agent.(warmRequester)
	if !ok {
		return false, nil
	}
	workload, err := templateWorkload(t, "", "")
	if err != nil {
		log.Warn("worker not warmed", "err", err)
		return false, nil
	}
	req := &torporv1.WarmRequest{Worker: w.GetMetadata().GetName(), Workload: workload}
	if _, err := wr.Warm(ctx, connect.NewRequest(req)); err != nil {
		log.Debug("worker not warmed", "err", err)
		return false, nil
	}
	w.Status.WarmTemplateUid, w.Status.WarmActorUid = t.GetMetadata().GetUid(), ""
	_, err = e.store.Workers().Update(ctx, w)
	switch {
	case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
		// Taken meanwhile: its start replaces the warm sandbox.
		return false, nil
	case err != nil:
		return false, err
	}
	e.metrics.warmed.WithLabelValues(t.GetMetadata().GetName()).Inc()
	log.Debug("worker warmed for the template")
	return true, nil
}
