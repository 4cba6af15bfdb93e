package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/slotgate"
)

// requestCalls is how many control-plane calls the router's requests
// waited for.
func (tr *testRouter) requestCalls(t testing.TB) float64 {
	t.Helper()
	n := 0.0
	for _, call := range []string{callGet, callResume, callReport, callLookupSandbox} {
		n += tr.metric(t, "torpor_router_request_control_plane_calls_total", map[string]string{"call": call})
	}
	return n
}

// knows reports whether the router's table places key on worker.
func (tr *testRouter) knows(key ActorKey, worker string) bool {
	at, ok := tr.actors.placement(key)
	return ok && at.target.Worker == worker
}

func (e *env) call(what string, fn func(context.Context, *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error), key ActorKey) *torporv1.Actor {
	e.t.Helper()
	a, err := fn(context.Background(), connect.NewRequest(&torporv1.GetRequest{Space: key.Space, Name: key.Name}))
	if err != nil {
		e.t.Fatalf("%s %s: %v", what, key, err)
	}
	return a.Msg
}

func (e *env) resume(key ActorKey) *torporv1.Actor {
	e.t.Helper()
	a, err := e.actors.ResumeActor(context.Background(), connect.NewRequest(&torporv1.ResumeActorRequest{Space: key.Space, Name: key.Name}))
	if err != nil {
		e.t.Fatalf("resume %s: %v", key, err)
	}
	return a.Msg
}

// Requests to a running actor make no call to the control plane: the
// router knows where it runs from the placement watch.
func TestRunningActorNeedsNoControlPlaneCall(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	w := e.resume(key).GetStatus().GetWorker().GetName()
	tr := e.newRouter(Config{})
	waitFor(t, "the watch to place the actor", func() bool { return tr.knows(key, w) })
	gets := e.callCount(torporv1connect.ActorServiceGetActorProcedure)
	before := tr.requestCalls(t)
	const requests = 300
	for i := range requests {
		if status, body := tr.get(t, key, fmt.Sprintf("/%d", i)); status != http.StatusOK || body != fmt.Sprintf("hello from app at /%d", i) {
			t.Fatalf("request %d: %d %q", i, status, body)
		}
	}
	// The first request after an idle spell tells the control plane
	// before it goes on (activity.go); no other one waits for a call.
	if calls := tr.requestCalls(t) - before; calls > 1 {
		t.Errorf("%v control-plane calls for %d requests to a running actor, want at most 1", calls, requests)
	}
	if n := e.callCount(torporv1connect.ActorServiceGetActorProcedure) - gets; n != 0 {
		t.Errorf("GetActor called %d times", n)
	}
}

// Actors are suspended, resumed and moved between workers behind the
// router's back, continuously, while requests for all of them flow through
// it: every request answered 200 is answered by the actor it named.
func TestMovesBehindTheRoutersBackNeverMisroute(t *testing.T) {
	const (
		actors  = 5
		workers = 3 // fewer than actors: a worker freed by one is taken by another
		moves   = 2000
		clients = 6
	)
	e := newEnv(t, workers, helloWorkload)
	var keys []ActorKey
	for i := range actors {
		keys = append(keys, e.createActor(fmt.Sprintf("a%d", i), nil))
	}
	tr := e.newRouter(Config{ParkTimeout: 30 * time.Second})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()

	ctx, stop := context.WithCancel(context.Background())
	var (
		wg                               sync.WaitGroup
		served, misrouted, failed, moved atomic.Int64
		mu                               sync.Mutex
		failures                         []string
	)
	for c := range clients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), 1))
			for ctx.Err() == nil {
				key := keys[r.IntN(actors)]
				resp, err := client.Do(tr.request(t, http.MethodGet, key, "/whoami", nil))
				if err != nil {
					t.Errorf("request for %s: %v", key, err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				want := fmt.Sprintf("hello from %s at /whoami", key.Name)
				switch {
				case resp.StatusCode == http.StatusOK && string(body) == want:
					served.Add(1)
				case resp.StatusCode == http.StatusOK:
					misrouted.Add(1)
					t.Errorf("request for %s answered %q", key, body)
				default:
					// A request that meets its actor in the middle of being
					// stopped may be refused; it must never reach another.
					failed.Add(1)
					mu.Lock()
					if len(failures) < 5 {
						failures = append(failures, fmt.Sprintf("%s: %d %s", key, resp.StatusCode, strings.TrimSpace(string(body))))
					}
					mu.Unlock()
				}
			}
		})
	}
	// A failed move ends the test: its clients stop before the router
	// they call is closed.
	defer func() {
		stop()
		wg.Wait()
	}()
	// The mover suspends a running actor and resumes a suspended one
	// through the API, which the router only hears of from its watch (or
	// from a gate's refusal).
	// Most requests wait for resumes under this churn; the moves go on
	// until enough got through for the count of misrouted ones to mean
	// something, however loaded the machine (a bound, not a speed check).
	const minServed = moves / 10
	giveUp := time.Now().Add(5 * time.Minute)
	r := rand.New(rand.NewPCG(99, 1))
	for (moved.Load() < moves || served.Load() < minServed) && time.Now().Before(giveUp) && !t.Failed() {
		key := keys[r.IntN(actors)]
		var err error
		if r.IntN(2) == 0 {
			_, err = e.actors.SuspendActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: key.Space, Name: key.Name}))
		} else {
			_, err = e.actors.ResumeActor(ctx, connect.NewRequest(&torporv1.ResumeActorRequest{Space: key.Space, Name: key.Name}))
		}
		// Conflicts with the router's own resumes, an actor already
		// stopped, or no free worker are the point of the exercise.
		if err != nil && !errors.Is(err, context.Canceled) {
			switch connect.CodeOf(err) {
			case connect.CodeFailedPrecondition, connect.CodeAborted, connect.CodeResourceExhausted:
				continue
			}
			t.Fatalf("move %s: %v", key, err)
		}
		moved.Add(1)
	}
	stop()
	wg.Wait()
	t.Logf("%d moves; %d requests answered by their actor, %d refused, %d misrouted; refusals: %v", moved.Load(), served.Load(), failed.Load(), misrouted.Load(), failures)
	if misrouted.Load() != 0 {
		t.Fatalf("%d requests answered by another actor", misrouted.Load())
	}
	if served.Load() < minServed {
		t.Errorf("only %d requests served during %d moves", served.Load(), moved.Load())
	}
}

// cuttable is a control-plane transport a test can cut: calls fail and
// open streams end, as when the control plane is out of reach.
type cuttable struct {
	next http.RoundTripper
	mu   sync.Mutex
	down bool
	open []io.Closer
}

func (c *cuttable) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	down := c.down
	c.mu.Unlock()
	if down {
		return nil, errors.New("control plane out of reach (test)")
	}
	resp, err := c.next.RoundTrip(req)
	if err == nil {
		c.mu.Lock()
		c.open = append(c.open, resp.Body)
		c.mu.Unlock()
	}
	return resp, err
}

func (c *cuttable) cut(down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = down
	if down {
		for _, b := range c.open {
			b.Close()
		}
		c.open = nil
	}
}

// A router cut off from the control plane keeps placements that went
// stale meanwhile; none of them reaches another actor, and once the
// watch resumes its view is current again without a request.
func TestRouterCutOffRecoversWithoutServingStale(t *testing.T) {
	e := newEnv(t, 2, helloWorkload)
	a, b, c := e.createActor("a", nil), e.createActor("b", nil), e.createActor("c", nil)
	w := e.resume(a).GetStatus().GetWorker().GetName()
	e.resume(c) // takes the other worker
	hc := e.routerClient()
	link := &cuttable{next: hc.Transport}
	tr := e.newRouter(Config{HTTPClient: &http.Client{Transport: link}, ParkTimeout: 20 * time.Second})
	waitFor(t, "the watch to place a", func() bool { return tr.knows(a, w) })
	if status, body := tr.get(t, a, "/"); status != http.StatusOK || body != "hello from a at /" {
		t.Fatalf("request before the cut: %d %q", status, body)
	}

	link.cut(true)
	e.call("suspend", e.actors.SuspendActor, a)
	if got := e.resume(b).GetStatus().GetWorker().GetName(); got != w {
		t.Fatalf("b resumed on %s, want a's worker %s", got, w)
	}
	if !tr.knows(a, w) {
		t.Fatal("the cut router no longer places a on its old worker: the test would prove nothing")
	}
	link.cut(false)
	// a's stale placement names b's worker: the gate refuses it, and the
	// request resumes a instead of reaching b.
	if status, body := tr.get(t, a, "/after"); status != http.StatusOK || body != "hello from a at /after" {
		t.Fatalf("request after the cut: %d %q", status, body)
	}
	// The watch resumes and brings b's placement without a request.
	waitFor(t, "the watch to place b", func() bool { return tr.knows(b, w) })
	gets := e.callCount(torporv1connect.ActorServiceGetActorProcedure)
	if status, body := tr.get(t, b, "/"); status != http.StatusOK || body != "hello from b at /" {
		t.Fatalf("request for b: %d %q", status, body)
	}
	if n := e.callCount(torporv1connect.ActorServiceGetActorProcedure) - gets; n != 0 {
		t.Errorf("GetActor called %d times for an actor the watch placed", n)
	}
	if n := tr.metric(t, "torpor_router_placement_watch_restarts_total", nil); n < 1 {
		t.Errorf("watch restarts: %v, want at least 1", n)
	}
}

// A new router (a restarted one) learns every running actor from the
// watch's reset and serves them without asking the control plane.
func TestRestartedRouterLearnsRunningActors(t *testing.T) {
	e := newEnv(t, 2, helloWorkload)
	a, b := e.createActor("a", nil), e.createActor("b", nil)
	wa, wb := e.resume(a).GetStatus().GetWorker().GetName(), e.resume(b).GetStatus().GetWorker().GetName()
	tr := e.newRouter(Config{})
	waitFor(t, "the reset to place both actors", func() bool { return tr.knows(a, wa) && tr.knows(b, wb) })
	gets := e.callCount(torporv1connect.ActorServiceGetActorProcedure)
	for _, key := range []ActorKey{a, b} {
		if status, body := tr.get(t, key, "/"); status != http.StatusOK || body != fmt.Sprintf("hello from %s at /", key.Name) {
			t.Fatalf("request for %s: %d %q", key, status, body)
		}
	}
	if n := e.callCount(torporv1connect.ActorServiceGetActorProcedure) - gets; n != 0 {
		t.Errorf("GetActor called %d times", n)
	}
	// An actor stopped while the router runs leaves its table.
	e.call("suspend", e.actors.SuspendActor, a)
	waitFor(t, "the watch to drop a", func() bool { _, ok := tr.actors.placement(a); return !ok })
}

// Of two placements of one actor the newer record wins, whatever order
// the watch and the router's own reads deliver them in.
func TestTableKeepsTheNewestPlacement(t *testing.T) {
	tab := newActorTable()
	key := ActorKey{Space: "default", Name: "a"}
	at := func(version int64, worker string) placement {
		return placement{version: version, target: slotgate.Target{Gate: "g:1", Worker: worker, ActorUID: "uid-a", Port: 8080}}
	}
	tab.learn(key, at(5, "w0"))
	tab.stopped(key, "uid-a", 7) // a read saw it suspended
	tab.learn(key, at(5, "w0"))  // the watch, late
	if p, ok := tab.placement(key); ok {
		t.Fatalf("a placement older than the stop was taken: %+v", p)
	}
	tab.learn(key, at(9, "w1"))
	tab.learn(key, at(8, "w0"))
	if p, ok := tab.placement(key); !ok || p.target.Worker != "w1" {
		t.Fatalf("placement %+v, %v; want version 9 on w1", p, ok)
	}
	// The same name created again is another actor: its placement wins.
	tab.learn(key, placement{version: 1, target: slotgate.Target{Gate: "g:1", Worker: "w2", ActorUID: "uid-b", Port: 8080}})
	if p, _ := tab.placement(key); p.target.ActorUID != "uid-b" {
		t.Fatalf("placement %+v; want the new actor's", p)
	}
}
