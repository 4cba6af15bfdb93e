package workflow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// HostMemory is a node's memory as its heartbeat reports it, in bytes
// (0: not known).
type HostMemory struct{ Available, Total int64 }

// DefaultNodeMemoryFloor is torpor server's --node-memory-floor: the
// share of a node's memory, in percent, below which its frozen actors go
// down the idle ladder.
const DefaultNodeMemoryFloor = 10

// below says whether m is known and under floor percent of its total.
func (m HostMemory) below(floor int) bool {
	return floor > 0 && m.Total > 0 && m.Available*100 < int64(floor)*m.Total
}

// relieved remembers, per node, the heartbeat whose memory reading a
// relief acted on: the next relief waits for a newer reading.
type relieved struct {
	mu sync.Mutex
	at map[string]int64 // node → heartbeat time (unix nanos)
}

// take reports whether node's reading at heartbeat is not acted on yet,
// and marks it so.
func (r *relieved) take(node string, heartbeat int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at = map[string]int64{}
	}
	if r.at[node] >= heartbeat {
		return false
	}
	r.at[node] = heartbeat
	return true
}

// relieveMemory is the idle ladder under memory pressure: on every live
// node whose last heartbeat found its available memory below the floor
// (Options.NodeMemoryFloor), the least recently active of its frozen
// actors is paused or suspended, as its idle policy says. One per node
// per heartbeat: the next reading says whether that was enough. Actors
// that are not frozen are active, and are left alone; so are E2B
// sandboxes (their lease decides) and actors never evicted.
func (e *Engine) relieveMemory(ctx context.Context) error {
	floor := e.opts.NodeMemoryFloor
	if floor <= 0 {
		return nil
	}
	nodes, err := store.ListAll(ctx, e.store.Nodes(), store.ListOptions{})
	if err != nil {
		return err
	}
	short := map[string]HostMemory{}
	for _, n := range nodes {
		mem := HostMemory{Available: n.GetMemoryAvailableBytes(), Total: n.GetMemoryTotalBytes()}
		if e.alive(n) && mem.below(floor) && e.relieved.take(n.GetMetadata().GetName(), n.GetHeartbeatTime().AsTime().UnixNano()) {
			short[n.GetMetadata().GetName()] = mem
		}
	}
	if len(short) == 0 {
		return nil
	}
	running, err := store.ListAll(ctx, e.store.Actors(), store.ListOptions{Filter: store.Filter{"state": torporv1.ActorState_ACTOR_STATE_RUNNING.String()}})
	if err != nil {
		return err
	}
	byNode := map[string][]*torporv1.Actor{}
	for _, a := range running {
		st := a.GetStatus()
		if _, ok := short[st.GetWorker().GetNode()]; ok && st.GetFrozenTime() != nil && !isSandbox(a) && !policyOf(st.GetCurrentTemplateSpec()).never {
			byNode[st.GetWorker().GetNode()] = append(byNode[st.GetWorker().GetNode()], a)
		}
	}
	var errs []error
	for node, frozen := range byNode {
		acts, err := e.ActivityOf(ctx, frozen)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		slices.SortFunc(frozen, func(x, y *torporv1.Actor) int {
			return cmp.Compare(acts[x.GetMetadata().GetUid()].LastActive.UnixNano(), acts[y.GetMetadata().GetUid()].LastActive.UnixNano())
		})
		a, mem := frozen[0], short[node]
		p := policyOf(a.GetStatus().GetCurrentTemplateSpec())
		_, err = e.stopIdle(ctx, a, p.kind, stopCause{
			reason: fmt.Sprintf("node %s is short of memory (%d MiB of %d MiB available, below its floor of %d%%): its least recently active frozen actor goes down the idle ladder",
				node, mem.Available>>20, mem.Total>>20, floor),
			metric: "memory",
			cutoff: a.GetStatus().GetFrozenTime().AsTime(),
		})
		if err != nil && !errors.Is(err, errStopCancelled) && !errors.Is(err, errRetry) {
			errs = append(errs, fmt.Errorf("relieve node %s: actor %s: %w", node, actorKey(a), err))
		}
	}
	return errors.Join(errs...)
}
