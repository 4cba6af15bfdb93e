package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// routerPair is the routers and a client of them that alternates between
// them, trying the next one when a router refuses the connection.
type routerPair struct {
	procs   []*routerProcess
	clients []*http.Client
	next    atomic.Uint32
}

func startRouters(t *testing.T, c *cluster, bin string, n int) *routerPair {
	t.Helper()
	rp := &routerPair{}
	for i := range n {
		name := fmt.Sprintf("router-%d-%s", i+1, randomHex(3))
		token, fingerprint := c.createJoinToken(&torporv1.CreateTokenRequest{
			Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_CLIENT_JOIN, Name: name, Role: torporv1.ClientRole_CLIENT_ROLE_ROUTER,
		})
		r := &routerProcess{addr: testkit.FreeAddr(t)}
		r.args = []string{"router", "--name", name, "--server", c.api, "--ca-fingerprint", fingerprint,
			"--state-dir", t.TempDir(), "--listen", r.addr}
		// The token joins the first start only; a restart uses the saved
		// certificate.
		r.p = startProcessOf(t, bin, "router-"+r.addr, append(r.args, "--join-token", token)...)
		r.waitListening(t)
		hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{}}
		t.Cleanup(hc.CloseIdleConnections)
		rp.procs, rp.clients = append(rp.procs, r), append(rp.clients, hc)
	}
	return rp
}

// get sends GET path for actor to the next router.
func (rp *routerPair) get(ctx context.Context, actor, path string) (int, string, error) {
	first := int(rp.next.Add(1))
	var err error
	for i := range rp.procs {
		k := (first + i) % len(rp.procs)
		var req *http.Request
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, "http://"+rp.procs[k].addr+path, nil)
		if err != nil {
			return 0, "", err
		}
		req.Host = actor + ".default.actors.localhost"
		var resp *http.Response
		resp, err = rp.clients[k].Do(req)
		if err != nil && refused(err) {
			continue
		}
		if err != nil {
			return 0, "", err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, strings.TrimSpace(string(body)), err
	}
	return 0, "", fmt.Errorf("every router refused: %w", err)
}

// count sends GET / for actor and fails the test unless it answers
// count after last: the counter's memory and files went on.
func (rp *routerPair) count(ctx context.Context, t *testing.T, actor string, last int) int {
	t.Helper()
	code, body, err := rp.get(ctx, actor, "/")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET / of %s through the routers: %d %q %v", actor, code, body, err)
	}
	if want := fmt.Sprintf("count=%d lines=%d", last+1, last+1); body != want {
		t.Fatalf("GET / of %s through the routers: %q, want %q", actor, body, want)
	}
	return last + 1
}

// traffic sends GET / to each of its actors through the routers, one
// request at a time per actor, until stopped, and checks that every answer
// is the previous count + 1 (or up to one more per failed request since).
type traffic struct {
	t *testing.T
	// stopped ends the loops between requests: a request cut short would
	// leave its actor's count unknown.
	stopped atomic.Bool
	wg      sync.WaitGroup
	phase   atomic.Pointer[string]
	// A GET the router sent twice (cut after the gate admitted it, then
	// sent again, as RFC 9110 lets a proxy do with an idempotent
	// request) is counted twice by the counter, which counts GETs: an
	// answer one above the next count is that, counted in resent and
	// reported, not a failure. The previous version's node agent stops
	// its gate with it, which cuts requests so; why a current one's
	// restart did, once in seven runs of TestRestartsUnnoticed, is not
	// known yet (docs/faults.md).
	// mayCut is set while a router is killed: a request it was serving
	// is cut mid-way (a transport error, not a refused connection), and
	// the client cannot know whether the actor counted it.
	mayCut atomic.Bool
	// gaps is the pause after each request of an actor, 20 ms if unset
	// (fixed before the traffic starts).
	gaps map[string]time.Duration

	mu       sync.Mutex
	resent   int
	cut      []string
	counts   map[string]int
	requests int
	failures []string
	// longest is the longest answer, by phase.
	longest map[string]time.Duration
	phases  []string
}

func startTraffic(t *testing.T, rp *routerPair, counts map[string]int) *traffic {
	return startTrafficWithGaps(t, rp, counts, nil)
}

// startTrafficWithGaps is startTraffic pausing gaps[actor] after each
// request of actor (20 ms for one not named).
func startTrafficWithGaps(t *testing.T, rp *routerPair, counts map[string]int, gaps map[string]time.Duration) *traffic {
	tr := &traffic{t: t, counts: counts, gaps: gaps, longest: map[string]time.Duration{}}
	tr.enter("start")
	for actor := range counts {
		tr.wg.Go(func() { tr.run(rp, actor) })
	}
	t.Cleanup(func() { tr.stop() })
	return tr
}

// enter starts phase: the requests from now on are counted under it.
func (tr *traffic) enter(phase string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.phases = append(tr.phases, phase)
	tr.phase.Store(&phase)
}

func (tr *traffic) run(rp *routerPair, actor string) {
	unknown := 0
	for !tr.stopped.Load() {
		phase := *tr.phase.Load()
		start := time.Now()
		code, body, err := rp.get(context.Background(), actor, "/")
		took := time.Since(start)
		tr.mu.Lock()
		tr.requests++
		tr.longest[phase] = max(tr.longest[phase], took)
		var n, lines int
		switch {
		case err != nil && code == 0 && !refused(err) && tr.mayCut.Load():
			unknown++
			tr.cut = append(tr.cut, fmt.Sprintf("%s (%s, after %s): %v", actor, phase, took.Round(time.Millisecond), err))
		case err != nil || code != http.StatusOK:
			unknown++
			tr.failures = append(tr.failures, fmt.Sprintf("%s (%s, after %s): %d %q %v", actor, phase, took.Round(time.Millisecond), code, body, err))
		default:
			_, err := fmt.Sscanf(body, "count=%d lines=%d", &n, &lines)
			if err == nil && n == lines && n == tr.counts[actor]+2+unknown {
				tr.resent++
				tr.t.Logf("%s (%s) answered %q: a GET the router sent twice, counted twice", actor, phase, body)
				unknown++
			}
			if err != nil || n != lines || n < tr.counts[actor]+1 || n > tr.counts[actor]+1+unknown {
				tr.t.Errorf("%s (%s) answered %q, want count=lines in [%d, %d]", actor, phase, body, tr.counts[actor]+1, tr.counts[actor]+1+unknown)
			}
			tr.counts[actor], unknown = n, 0
		}
		tr.mu.Unlock()
		gap := tr.gaps[actor]
		if gap == 0 {
			gap = 20 * time.Millisecond
		}
		time.Sleep(gap)
	}
}

// stop ends the traffic and returns the last count of each actor.
func (tr *traffic) stop() map[string]int {
	tr.stopped.Store(true)
	tr.wg.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.counts
}

// report fails the test for each failed request and logs what the
// client saw: requests, failures, the longest answer in each phase.
func (tr *traffic) report() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, f := range tr.failures {
		tr.t.Errorf("request failed: %s", f)
	}
	var waits []string
	for _, p := range tr.phases {
		waits = append(waits, fmt.Sprintf("%s %s", p, tr.longest[p].Round(time.Millisecond)))
	}
	for _, c := range tr.cut {
		tr.t.Logf("request cut mid-way by a router's kill: %s", c)
	}
	tr.t.Logf("traffic: %d requests, %d failed, %d cut mid-way by a router's kill, %d sent twice by a router; longest answer by phase: %s",
		tr.requests, len(tr.failures), len(tr.cut), tr.resent, strings.Join(waits, ", "))
}
