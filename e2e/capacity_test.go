package e2e

import (
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/router"
)

// TestCapacityIsManaged: 40 counter actors on 4 workers, requests in
// random order through the router from several clients. No answer is a
// 503 (every resume that finds the workers busy evicts an idle actor),
// and every answer's count is the actor's previous count plus one: memory
// survives every eviction, and no actor is evicted while it serves a
// request (its answer would be lost and the next count skip one).
// TORPOR_CAPACITY_REQUESTS sets the number of requests (default 200,
// about two minutes here; the figure is 2000).
func TestCapacityIsManaged(t *testing.T) {
	requests := 200
	if v := os.Getenv("TORPOR_CAPACITY_REQUESTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("TORPOR_CAPACITY_REQUESTS=%q: want a positive number", v)
		}
		requests = n
	}
	const (
		actors  = 40
		clients = 4
	)
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 4, parkTimeout: 2 * router.DefaultParkTimeout})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	for i := range actors {
		c.createActor(fmt.Sprintf("c%d", i), "counter")
	}
	// One request at a time per actor, so "previous" is well defined; the
	// clients pick actors at random.
	var (
		mu     sync.Mutex
		counts [actors]int
		locks  [actors]sync.Mutex
		sent   int
		wg     sync.WaitGroup
	)
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				mu.Lock()
				if sent == requests || t.Failed() {
					mu.Unlock()
					return
				}
				sent++
				mu.Unlock()
				i := mrand.IntN(actors)
				locks[i].Lock()
				code, _, body := c.routerGet(fmt.Sprintf("c%d", i))
				want := fmt.Sprintf("count=%d lines=%d", counts[i]+1, counts[i]+1)
				if code != http.StatusOK || body != want {
					t.Errorf("actor c%d: %d %q, want 200 %q", i, code, body, want)
				} else {
					counts[i]++
				}
				locks[i].Unlock()
			}
		})
	}
	wg.Wait()
	evictions := 0
	for i := range actors {
		for _, ev := range c.events(fmt.Sprintf("c%d", i)) {
			if strings.HasPrefix(ev.GetReason(), "evicted for ") {
				evictions++
			}
		}
	}
	if evictions == 0 {
		t.Error("no actor was evicted: the test did not fill the workers")
	}
	t.Logf("%d requests over %d actors on 4 workers by %d clients in %s, %d evictions", requests, actors, clients, time.Since(start).Round(time.Second), evictions)
}
