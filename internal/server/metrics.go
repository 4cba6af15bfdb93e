package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/torpor-dev/torpor/internal/scheduler"
	"github.com/torpor-dev/torpor/internal/store"
)

// workersCollector reports workers by pool and state, read from the
// store at scrape time so every replica reports the same numbers.
type workersCollector struct {
	store store.Store
	desc  *prometheus.Desc
}

func newWorkersCollector(st store.Store) *workersCollector {
	return &workersCollector{store: st, desc: prometheus.NewDesc("torpor_workers",
		"Registered workers by pool and state: busy (hosting an actor), reserved (freed by an eviction for a waiting resume), warm (free, a sandbox kept ready for the actor that left it or for a template's next actor) or free.",
		[]string{"pool", "state"}, nil)}
}

func (c *workersCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *workersCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type key struct{ pool, state string }
	counts := map[key]int{}
	pools := map[string]bool{}
	now := time.Now()
	for w, err := range store.All(ctx, c.store.Workers(), store.ListOptions{}) {
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.desc, err)
			return
		}
		pool, st := w.GetSpec().GetPool(), w.GetStatus()
		pools[pool] = true
		switch {
		case st.GetActor().GetUid() != "":
			counts[key{pool, "busy"}]++
		case scheduler.Reserved(w, "", now):
			counts[key{pool, "reserved"}]++
		case st.GetWarmActorUid() != "" || st.GetWarmTemplateUid() != "":
			counts[key{pool, "warm"}]++
		default:
			counts[key{pool, "free"}]++
		}
	}
	// Every state of every pool, zeros included, so sums and rates over
	// them are defined.
	for pool := range pools {
		for _, state := range []string{"busy", "reserved", "warm", "free"} {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[key{pool, state}]), pool, state)
		}
	}
}
