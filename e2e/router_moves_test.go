package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/router"
)

// TestRouterNeverMisroutesWhileActorsMove, on gVisor: counters are
// suspended, resumed and moved between workers through the API while
// requests for all of them flow through the router, which learns of the
// moves only from its placement watch or the slot gates' refusals. Every
// request answered 200 names (in /whoami) the actor it was sent to. The
// test runtime's version (internal/router) makes thousands of moves; this
// one makes tens with real sandboxes, on both stores (PostgreSQL commits
// the history out of order).
func TestRouterNeverMisroutesWhileActorsMove(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) { testRouterNeverMisroutes(t, backend) })
	}
}

func testRouterNeverMisroutes(t *testing.T, backend string) {
	const (
		actors  = 3
		moves   = 40
		clients = 3
	)
	c := newCluster(t, clusterOptions{backend: backend, workersPerNode: 2})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	var names []string
	for i := range actors {
		name := fmt.Sprintf("m%d", i)
		c.createActor(name, "counter")
		names = append(names, name)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()
	ctx, stop := context.WithCancel(context.Background())
	var (
		wg                        sync.WaitGroup
		served, misrouted, failed atomic.Int64
	)
	for i := range clients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 2))
			for ctx.Err() == nil {
				name := names[r.IntN(actors)]
				req, err := http.NewRequest(http.MethodGet, c.ingress+"/whoami", nil)
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set(router.ActorHeader, "default/"+name)
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("request for %s: %v", name, err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				// /whoami answers the actor's own certificate's SPIFFE id.
				switch got := strings.TrimSpace(string(body)); {
				case resp.StatusCode == http.StatusOK && strings.HasPrefix(got, "spiffe://torpor.local/space/default/actor/"+name+" "):
					served.Add(1)
				case resp.StatusCode == http.StatusOK:
					misrouted.Add(1)
					t.Errorf("request for %s answered by %q", name, got)
				default:
					// A request that met its actor being stopped may be
					// refused; it must never reach another.
					if failed.Add(1) <= 3 {
						t.Logf("request for %s: %d %s", name, resp.StatusCode, got)
					}
				}
			}
		})
	}
	r := rand.New(rand.NewPCG(7, 2))
	done := 0
	for done < moves && !t.Failed() {
		name := names[r.IntN(actors)]
		var err error
		if r.IntN(2) == 0 {
			_, err = c.actors.SuspendActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: name}))
		} else {
			_, err = c.resume(name, nil)
		}
		switch connect.CodeOf(err) {
		case connect.CodeFailedPrecondition, connect.CodeAborted, connect.CodeResourceExhausted:
			continue // already stopped, racing the router's resume, no free worker
		}
		if err != nil {
			t.Fatalf("move %s: %v", name, err)
		}
		done++
	}
	stop()
	wg.Wait()
	t.Logf("%d moves; %d requests answered by their actor, %d refused, %d misrouted", done, served.Load(), failed.Load(), misrouted.Load())
	if misrouted.Load() != 0 {
		t.Fatalf("%d requests answered by another actor", misrouted.Load())
	}
	// Most requests wait for a resume; enough must get through for the
	// count of misrouted ones to mean something.
	if served.Load() < moves/4 {
		t.Errorf("only %d requests served during %d moves", served.Load(), moves)
	}
}

// requestCalls sums torpor_router_request_control_plane_calls_total from
// the router's metrics: the control-plane calls its requests waited for.
func requestCalls(tb testing.TB, r *router.Router) float64 {
	tb.Helper()
	rec := httptest.NewRecorder()
	r.Admin().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	sum := 0.0
	for line := range strings.Lines(rec.Body.String()) {
		if !strings.HasPrefix(line, "torpor_router_request_control_plane_calls_total{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			tb.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}
