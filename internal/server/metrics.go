package server

import (
	"context"
	"iter"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/reflect/protoreflect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/scheduler"
	"github.com/torpor-dev/torpor/internal/store"
)

// countCollector reports how many objects of a collection are in each
// state, by group (a space, a pool), read from the store at scrape time
// so every replica reports the same numbers. Every state of every group
// seen is reported, zeros included, so sums and rates over them are
// defined.
type countCollector[T store.Object] struct {
	desc   *prometheus.Desc
	states []string
	list   func(context.Context) iter.Seq2[T, error]
	// classify is an object's group and state.
	classify func(T) (group, state string)
}

func (c *countCollector[T]) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *countCollector[T]) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type key struct{ group, state string }
	counts := map[key]int{}
	groups := map[string]bool{}
	for obj, err := range c.list(ctx) {
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.desc, err)
			return
		}
		group, state := c.classify(obj)
		groups[group] = true
		counts[key{group, state}]++
	}
	for group := range groups {
		for _, state := range c.states {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[key{group, state}]), group, state)
		}
	}
}

// stateNames are the values of an enum as users see them, unset left out.
func stateNames(e protoreflect.EnumDescriptor) []string {
	var names []string
	for i := range e.Values().Len() {
		if v := e.Values().Get(i); v.Number() != 0 {
			names = append(names, strings.TrimPrefix(string(v.Name()), enum.Prefix(e)))
		}
	}
	return names
}

func newWorkersCollector(st store.Store) *countCollector[*torporv1.Worker] {
	return &countCollector[*torporv1.Worker]{
		desc: prometheus.NewDesc("torpor_workers",
			"Registered workers by pool and state: busy (hosting an actor), reserved (freed by an eviction for a waiting resume), warm (free, a sandbox kept ready for the actor that left it or for a template's next actor) or free.",
			[]string{"pool", "state"}, nil),
		states: []string{"busy", "reserved", "warm", "free"},
		list: func(ctx context.Context) iter.Seq2[*torporv1.Worker, error] {
			return store.All(ctx, st.Workers(), store.ListOptions{})
		},
		classify: func(w *torporv1.Worker) (string, string) {
			pool, s := w.GetSpec().GetPool(), w.GetStatus()
			switch {
			case s.GetActor().GetUid() != "":
				return pool, "busy"
			case scheduler.Reserved(w, "", time.Now()):
				return pool, "reserved"
			case s.GetWarmActorUid() != "" || s.GetWarmTemplateUid() != "":
				return pool, "warm"
			}
			return pool, "free"
		},
	}
}

func newActorsCollector(st store.Store) *countCollector[*torporv1.Actor] {
	return &countCollector[*torporv1.Actor]{
		desc: prometheus.NewDesc("torpor_actors",
			"Actors by space and state (SUSPENDED, RESUMING, RUNNING, ... as torpor actor list shows them).",
			[]string{"space", "state"}, nil),
		states: stateNames(torporv1.ActorState(0).Descriptor()),
		list: func(ctx context.Context) iter.Seq2[*torporv1.Actor, error] {
			return store.All(ctx, st.Actors(), store.ListOptions{})
		},
		classify: func(a *torporv1.Actor) (string, string) {
			return a.GetMetadata().GetSpace(), enum.Name(a.GetStatus().GetState())
		},
	}
}

func newTemplatesCollector(st store.Store) *countCollector[*torporv1.Template] {
	return &countCollector[*torporv1.Template]{
		desc: prometheus.NewDesc("torpor_templates",
			"Templates by space and phase (PENDING, BUILDING, READY, FAILED: the phase of the newest revision, as torpor template list shows it).",
			[]string{"space", "phase"}, nil),
		states: stateNames(torporv1.TemplatePhase(0).Descriptor()),
		list: func(ctx context.Context) iter.Seq2[*torporv1.Template, error] {
			return store.All(ctx, st.Templates(), store.ListOptions{})
		},
		classify: func(t *torporv1.Template) (string, string) {
			return t.GetMetadata().GetSpace(), enum.Name(t.GetStatus().GetPhase())
		},
	}
}
