package node

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// actorUsage reports, at each scrape, the CPU time and memory of the
// actor each running worker hosts (a runtime Stats per running worker:
// one runsc events on gVisor).
type actorUsage struct{ m *slotMachine }

var (
	actorCPUDesc = prometheus.NewDesc("torpor_node_actor_cpu_seconds_total",
		"CPU time the sandbox of the actor (by worker, space and actor name) used since it started or was restored.", []string{"worker", "space", "actor"}, nil)
	actorMemoryDesc = prometheus.NewDesc("torpor_node_actor_memory_bytes",
		"Memory the sandbox of the actor (by worker, space and actor name) uses.", []string{"worker", "space", "actor"}, nil)
)

// usageTimeout bounds one scrape's Stats calls.
const usageTimeout = 5 * time.Second

func (u actorUsage) Describe(ch chan<- *prometheus.Desc) {
	ch <- actorCPUDesc
	ch <- actorMemoryDesc
}

func (u actorUsage) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), usageTimeout)
	defer cancel()
	for _, s := range u.m.slots {
		cur := s.current()
		if cur.Phase != phaseRunning {
			continue
		}
		w, err := cur.workload()
		if err != nil {
			continue
		}
		st, err := u.m.rt.Stats(ctx, s.rt)
		if err != nil || !st.Running {
			continue
		}
		ch <- prometheus.MustNewConstMetric(actorCPUDesc, prometheus.CounterValue, st.CPU.Seconds(), s.name(), w.GetSpace(), w.GetActor())
		ch <- prometheus.MustNewConstMetric(actorMemoryDesc, prometheus.GaugeValue, float64(st.MemoryBytes), s.name(), w.GetSpace(), w.GetActor())
	}
}
