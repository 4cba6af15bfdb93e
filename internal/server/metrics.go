package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/torpor-dev/torpor/internal/store"
)

// workersCollector reports busy and free workers, read from the store at
// scrape time so every replica reports the same numbers.
type workersCollector struct {
	store store.Store
	desc  *prometheus.Desc
}

func newWorkersCollector(st store.Store) *workersCollector {
	return &workersCollector{store: st, desc: prometheus.NewDesc("torpor_workers", "Registered workers by state (busy or free).", []string{"state"}, nil)}
}

func (c *workersCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *workersCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	busy, free := 0, 0
	opts := store.ListOptions{PageSize: 1000}
	for {
		page, next, err := c.store.Workers().List(ctx, opts)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.desc, err)
			return
		}
		for _, w := range page {
			if w.GetStatus().GetActor().GetUid() != "" {
				busy++
			} else {
				free++
			}
		}
		if next == "" {
			break
		}
		opts.PageToken = next
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(busy), "busy")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(free), "free")
}
