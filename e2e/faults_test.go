package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/testkit"
)

const (
	// faultActors is one actor per worker: how the installation shares
	// out capacity is not what TestFaults is about.
	faultActors  = 4
	faultWorkers = 4
	faultClients = 3
	// faultHeartbeatTimeout is the server's: longer than a node fault
	// (at most 3 s down, the restart, and `torpor node`'s heartbeat every
	// 3 s), so no fault here may lose a node.
	faultHeartbeatTimeout = 15 * time.Second
	// stuckAfterFaults is how long a step may stay -ING once the faults
	// have stopped (issue 11: re-driven within seconds, not minutes).
	stuckAfterFaults = 5 * time.Second
)

// The faults TestFaults injects, one at a time.
const (
	faultNode     = "node"
	faultServer   = "server"
	faultRouter   = "router"
	faultPostgres = "postgres"
)

var faultKinds = []string{faultNode, faultServer, faultRouter, faultPostgres}

// TestFaults runs a real installation (`torpor server` on PostgreSQL, one
// `torpor node` on gVisor, `torpor router`, all as processes) under a
// workload of requests, suspends, pauses and resumes over several counter
// actors, while it injects faults one at a time at random moments: kill -9
// of the node agent (back after 1-3 s), of the server, of the router, and a
// PostgreSQL restart. None of them lasts as long as the heartbeat timeout,
// so none may cost state (invariant 9): no actor CRASHED, no acknowledged
// count rolled back, every failure retryable, no step -ING for more than
// 5 s after the faults stop, placement reciprocal, and a clean stop of
// every process leaves nothing behind.
//
// TORPOR_FAULTS_OPS and TORPOR_FAULTS_FAULTS make a longer run (defaults
// 240 and 8: each kind twice).
func TestFaults(t *testing.T) {
	runtimetest.RequireRoot(t)
	ops, faults := envInt(t, "TORPOR_FAULTS_OPS", 240), envInt(t, "TORPOR_FAULTS_FAULTS", 8)
	in := install(t)
	c := in.c
	c.applyTemplate(counterTemplate(t, "counter", nil))
	w := &workload{t: t, c: c, begin: time.Now(), http: &http.Client{Timeout: time.Minute},
		ops: map[string]int{}, failed: map[string]int{}}
	t.Cleanup(w.http.CloseIdleConnections)
	for i := range faultActors {
		a := &tracked{name: fmt.Sprintf("f%d", i+1), state: torporv1.ActorState_ACTOR_STATE_SUSPENDED}
		c.createActor(a.name, "counter")
		w.actors = append(w.actors, a)
	}

	ctx, stop := context.WithCancel(context.Background())
	p := &poller{t: t, c: c, begin: w.begin, crashes: map[string]bool{}, stuck: map[string]bool{}}
	polled := make(chan struct{})
	go func() { defer close(polled); p.run(ctx) }()
	w.target.Store(int64(ops))
	worked := w.start(ctx)
	// A fatal failure of the injector ends the test: the workload must not
	// outlive it.
	t.Cleanup(func() {
		stop()
		<-worked
		<-polled
	})

	plan := faultPlan(ops, faults)
	injected := map[string]int{}
	for i, f := range plan {
		w.waitForOps(f.at)
		down, back := in.inject(f.kind)
		injected[f.kind]++
		t.Logf("%s fault %d/%d: %s down for %s, serving again after %s", w.since(), i+1, len(plan), f.kind,
			down.Round(time.Millisecond), back.Round(time.Millisecond))
	}
	p.faultsStopped(time.Now())
	// Load goes on after the faults stop: recovery is judged under it.
	w.target.Store(max(int64(ops), w.issued.Load()+int64(ops)/10))
	w.faultsDone.Store(true)
	<-worked
	p.waitSettled(ctx)

	crashes := 0
	for _, a := range w.actors {
		for _, e := range c.events(a.name) {
			if e.GetToState() == torporv1.ActorState_ACTOR_STATE_CRASHED {
				crashes++
				t.Errorf("actor %s CRASHED at %s: %s", a.name, e.GetTime().AsTime().Sub(w.begin).Round(time.Millisecond), e.GetReason())
			}
		}
	}
	c.checkReciprocal()
	stop()
	<-polled

	// Each actor answers its next count, and is suspended: a node agent
	// with no actor running stops clean.
	for _, a := range w.actors {
		if err := w.request(context.Background(), a); err != nil {
			t.Errorf("after the faults: request to %s: %v", a.name, err)
		}
		if err := w.step(context.Background(), a, "suspend"); err != nil {
			t.Errorf("after the faults: suspend %s: %v", a.name, err)
		}
	}

	longest, longestAfter := p.longestStints()
	w.mu.Lock()
	t.Logf("faults summary: ops=%d %v; faults=%d %v; failed ops=%d %v; refused ops=%d; crashes=%d; rollbacks=%d; jumps=%d; longest -ING %s; longest after the faults stopped %s; %s",
		sum(w.ops), w.ops, len(plan), injected, sum(w.failed), w.failed, w.refused, crashes, w.rollbacks, w.jumps,
		longest, longestAfter, w.since())
	w.mu.Unlock()

	in.stopClean()
}

// installation is the processes TestFaults runs and restarts.
type installation struct {
	t  *testing.T
	pg *storetest.Postgres
	c  *cluster

	serverDir, serverAddr string
	serverArgs            []string
	server                *process

	node *nodeProcess

	routerAddr string
	routerArgs []string
	router     *process
}

func install(t *testing.T) *installation {
	t.Helper()
	in := &installation{t: t, pg: storetest.StartPostgres(t), serverDir: t.TempDir(), serverAddr: testkit.FreeAddr(t)}
	snapshots := filepath.Join(in.serverDir, "snapshots")
	in.serverArgs = []string{"--store", in.pg.URL(), "--snapshots", snapshots, "--heartbeat-timeout", faultHeartbeatTimeout.String()}
	var conn client.Connection
	in.server, conn = serverProcess(t, in.serverDir, in.serverAddr, in.serverArgs...)
	in.c = apiCluster(t, conn)
	in.c.snapshotStorage = snapshots
	in.node = in.c.startNodeProcess(faultWorkers)

	const routerName = "faults-router"
	token, fingerprint := in.c.createJoinToken(&torporv1.CreateTokenRequest{
		Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_CLIENT_JOIN, Name: routerName, Role: torporv1.ClientRole_CLIENT_ROLE_ROUTER,
	})
	in.routerAddr = testkit.FreeAddr(t)
	in.routerArgs = []string{"router", "--name", routerName, "--server", in.c.api, "--ca-fingerprint", fingerprint,
		"--state-dir", t.TempDir(), "--listen", in.routerAddr}
	// The token joins the first start only; a restart uses the saved
	// certificate.
	in.router = startProcess(t, "router", append(in.routerArgs, "--join-token", token)...)
	in.waitForRouter()
	in.c.ingress = "http://" + in.routerAddr
	return in
}

func (in *installation) waitForRouter() {
	in.t.Helper()
	in.c.waitFor("router listening on "+in.routerAddr, func() bool {
		if !in.router.running() {
			in.t.Fatalf("torpor router exited:\n%s", tail(in.router.logPath, 4<<10))
		}
		conn, err := net.Dial("tcp", in.routerAddr)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
}

// inject kills one part (or stops PostgreSQL), starts it again and
// returns once it serves: how long it was down, and until it served.
func (in *installation) inject(kind string) (down, back time.Duration) {
	t := in.t
	t.Helper()
	start := time.Now()
	down = time.Duration(mrand.Int64N(int64(2 * time.Second)))
	switch kind {
	case faultNode:
		down += time.Second
		in.node.kill()
		time.Sleep(down)
		in.node.restart(in.c)
	case faultServer:
		in.server.kill()
		time.Sleep(down)
		in.server, _ = serverProcess(t, in.serverDir, in.serverAddr, in.serverArgs...)
	case faultRouter:
		in.router.kill()
		time.Sleep(down)
		in.router = startProcess(t, "router-again", in.routerArgs...)
		in.waitForRouter()
	case faultPostgres:
		in.pg.Stop(t)
		time.Sleep(down)
		in.pg.Start(t)
	default:
		t.Fatalf("unknown fault %q", kind)
	}
	return down, time.Since(start)
}

// stopClean stops node, router and server with SIGTERM, as an operator
// does: each exits 0, and the node leaves nothing on the host.
func (in *installation) stopClean() {
	t := in.t
	t.Helper()
	for _, p := range []*process{in.node.process, in.router, in.server} {
		stopNodeProcess(t, p)
	}
	// Sandbox processes may be reaped a moment after the agent exits.
	var left []string
	deadline := time.Now().Add(10 * time.Second)
	for left = nodeLeftovers(t, in.node); len(left) > 0 && time.Now().Before(deadline); left = nodeLeftovers(t, in.node) {
		time.Sleep(100 * time.Millisecond)
	}
	for _, l := range left {
		t.Errorf("after a clean stop of node %s: %s left", in.node.name, l)
	}
}

type plannedFault struct {
	at   int64 // the number of operations issued before it
	kind string
}

// faultPlan spreads faults over the first nine tenths of ops operations at
// random, each kind in turn (in a random order per round), so that a run
// of four faults or more meets every kind.
func faultPlan(ops, faults int) []plannedFault {
	plan := make([]plannedFault, faults)
	var kinds []string
	for i := range plan {
		if len(kinds) == 0 {
			kinds = slices.Clone(faultKinds)
			mrand.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		}
		plan[i] = plannedFault{at: int64(ops/10 + mrand.IntN(max(1, ops*8/10))), kind: kinds[0]}
		kinds = kinds[1:]
	}
	slices.SortFunc(plan, func(a, b plannedFault) int { return int(a.at - b.at) })
	return plan
}

// tracked is what the workload knows of one actor. Its mutex is held for
// the whole of an operation on it, so its operations never overlap.
type tracked struct {
	name string
	mu   sync.Mutex
	// count is what the last successful request answered.
	count int
	// unknown counts the requests since then that failed: each may have
	// reached the actor or not.
	unknown int
	// state is what the last acknowledged operation left the actor in;
	// unspecified after a failure.
	state torporv1.ActorState
}

// workload issues operations over the actors from faultClients clients
// and checks every answer against what was acknowledged before.
type workload struct {
	t      *testing.T
	c      *cluster
	http   *http.Client
	actors []*tracked
	begin  time.Time

	// target is how many operations to issue; the workload also runs
	// until faultsDone, so that every fault meets load.
	target     atomic.Int64
	issued     atomic.Int64
	faultsDone atomic.Bool

	mu        sync.Mutex
	ops       map[string]int // by kind
	failed    map[string]int // by kind and cause, all retryable
	refused   int            // wrong state for the operation (FailedPrecondition)
	rollbacks int
	jumps     int
}

func (w *workload) since() string {
	return fmt.Sprintf("%6.1fs", time.Since(w.begin).Seconds())
}

// start runs the clients until the target is reached (and the faults are
// done) or ctx ends; the channel closes when they have.
func (w *workload) start(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range faultClients {
		wg.Go(func() {
			for ctx.Err() == nil && (!w.faultsDone.Load() || w.issued.Load() < w.target.Load()) {
				a := w.pick()
				if a == nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				w.issued.Add(1)
				op := a.choose()
				var err error
				if op == "request" {
					err = w.request(ctx, a)
				} else {
					err = w.step(ctx, a, op)
				}
				a.mu.Unlock()
				if err != nil && ctx.Err() == nil {
					w.t.Logf("%s %s %s failed: %v", w.since(), op, a.name, err)
					time.Sleep(time.Duration(250+mrand.IntN(500)) * time.Millisecond)
				}
			}
		})
	}
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

// pick locks an actor no other client works on, at random, or returns
// nil: an actor whose step hangs holds up one client, not all of them.
func (w *workload) pick() *tracked {
	for _, i := range mrand.Perm(len(w.actors)) {
		if a := w.actors[i]; a.mu.TryLock() {
			return a
		}
	}
	return nil
}

func (w *workload) waitForOps(n int64) {
	for w.issued.Load() < n {
		time.Sleep(50 * time.Millisecond)
	}
}

// choose picks the next operation on a: mostly requests, and steps that
// the actor's last known state allows.
func (a *tracked) choose() string {
	r := mrand.IntN(10)
	switch a.state {
	case torporv1.ActorState_ACTOR_STATE_SUSPENDED, torporv1.ActorState_ACTOR_STATE_PAUSED:
		if r < 6 {
			return "request"
		}
		return "resume"
	}
	switch {
	case r < 5:
		return "request"
	case r < 7:
		return "suspend"
	case r < 9:
		return "pause"
	}
	return "resume"
}

// request sends GET / for a through the router. The answer must be the
// count after the last acknowledged one: exactly count+1, or up to one
// more per request since then whose outcome is unknown. Lower is a
// rollback. A failure is returned (and counted) if retryable, reported
// otherwise.
func (w *workload) request(ctx context.Context, a *tracked) error {
	w.count("request", "")
	code, body, err := w.routerGet(ctx, a.name)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("HTTP %d: %s", code, body)
	}
	if err != nil {
		a.unknown++
		a.state = torporv1.ActorState_ACTOR_STATE_UNSPECIFIED
		// A 200 whose body was cut (the router died mid-answer) is a
		// transport failure too.
		cause := "transport"
		if code != 0 && code != http.StatusOK {
			cause = strconv.Itoa(code)
		}
		if code != 0 && code != http.StatusOK && code < 500 {
			w.t.Errorf("%s request to %s: %v, want 200 or a retryable 5xx", w.since(), a.name, err)
		}
		w.count("request", cause)
		return err
	}
	var count, lines int
	if _, err := fmt.Sscanf(body, "count=%d lines=%d", &count, &lines); err != nil {
		w.t.Errorf("%s request to %s answered %q, want count=N lines=N", w.since(), a.name, body)
		return nil
	}
	lo, hi := a.count+1, a.count+1+a.unknown
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case count < lo || lines < lo:
		w.rollbacks++
		w.t.Errorf("%s ROLLBACK: %s answered %q, want count and lines in [%d, %d] (acknowledged count=%d, %d requests of unknown outcome since)",
			w.since(), a.name, body, lo, hi, a.count, a.unknown)
	case count > hi || lines > hi:
		w.jumps++
		w.t.Errorf("%s %s answered %q, want count and lines in [%d, %d] (acknowledged count=%d, %d requests of unknown outcome since)",
			w.since(), a.name, body, lo, hi, a.count, a.unknown)
	case count != lines:
		w.t.Errorf("%s %s answered %q: memory and files disagree", w.since(), a.name, body)
	}
	a.count, a.unknown, a.state = count, 0, torporv1.ActorState_ACTOR_STATE_RUNNING
	return nil
}

func (w *workload) routerGet(ctx context.Context, actor string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.c.ingress+"/", nil)
	if err != nil {
		return 0, "", err
	}
	req.Host = actor + ".default.actors.localhost"
	resp, err := w.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body)), err
}

// step suspends, pauses or resumes a through the API. A refusal for the
// actor's state is counted, not returned: a failure before left the state
// unknown.
func (w *workload) step(ctx context.Context, a *tracked, op string) error {
	w.count(op, "")
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req := connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: a.name})
	var resp *connect.Response[torporv1.Actor]
	var err error
	switch op {
	case "suspend":
		resp, err = w.c.actors.SuspendActor(ctx, req)
	case "pause":
		resp, err = w.c.actors.PauseActor(ctx, req)
	case "resume":
		resp, err = w.c.actors.ResumeActor(ctx, connect.NewRequest(&torporv1.ResumeActorRequest{Space: "default", Name: a.name}))
	}
	if err == nil {
		a.state = resp.Msg.GetStatus().GetState()
		return nil
	}
	a.state = torporv1.ActorState_ACTOR_STATE_UNSPECIFIED
	switch code := connect.CodeOf(err); code {
	case connect.CodeFailedPrecondition:
		w.mu.Lock()
		w.refused++
		w.mu.Unlock()
		return nil
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeAborted, connect.CodeResourceExhausted:
		w.count(op, code.String())
	case connect.CodeCanceled:
		// The client library calls a connection reset by the server
		// (killed mid-call), or the pipe it broke while the request was
		// being written, canceled.
		if !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) || ctx.Err() != nil {
			w.t.Errorf("%s %s %s: %v, want a retryable code", w.since(), op, a.name, err)
		}
		w.count(op, "reset")
	default:
		w.count(op, code.String())
		w.t.Errorf("%s %s %s: %v, want a retryable code", w.since(), op, a.name, err)
	}
	return err
}

// count records an operation of kind, or with a cause, its failure.
func (w *workload) count(kind, cause string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if cause == "" {
		w.ops[kind]++
	} else {
		w.failed[kind+" "+cause]++
	}
}

// poller watches the actors through the API: crashes, and how long steps
// stay -ING (by their operation's start time).
type poller struct {
	t     *testing.T
	c     *cluster
	begin time.Time

	mu sync.Mutex
	// faultsEnd is zero while faults are being injected.
	faultsEnd    time.Time
	longest      time.Duration
	longestWhat  string
	longestAfter time.Duration
	crashes      map[string]bool // actor and state time
	stuck        map[string]bool // operation id
}

func (p *poller) run(ctx context.Context) {
	for ctx.Err() == nil {
		p.poll(ctx) //nolint:errcheck // a fault: the next poll sees more
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// poll looks at every actor once and reports whether none was -ING.
func (p *poller) poll(ctx context.Context) (settled bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := p.c.actors.ListActors(ctx, connect.NewRequest(&torporv1.ListRequest{}))
	if err != nil {
		return false, err
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	settled = true
	for _, a := range resp.Msg.GetActors() {
		st := a.GetStatus()
		name := a.GetMetadata().GetName()
		if st.GetState() == torporv1.ActorState_ACTOR_STATE_CRASHED {
			if key := name + st.GetStateTime().AsTime().String(); !p.crashes[key] {
				p.crashes[key] = true
				p.t.Errorf("%6.1fs actor %s is CRASHED: %s", now.Sub(p.begin).Seconds(), name, st.GetCrashReason())
			}
		}
		if !inFlight(st.GetState()) {
			continue
		}
		settled = false
		since := st.GetStateTime().AsTime()
		if op := st.GetOperation(); op != nil {
			since = op.GetStartTime().AsTime()
		}
		if stint := now.Sub(since); stint > p.longest {
			p.longest = stint
			p.longestWhat = fmt.Sprintf("%s %s from %.1fs, operation %s", name, st.GetState(), since.Sub(p.begin).Seconds(), st.GetOperation().GetId())
		}
		if p.faultsEnd.IsZero() {
			continue
		}
		if since.Before(p.faultsEnd) {
			since = p.faultsEnd
		}
		stint := now.Sub(since)
		p.longestAfter = max(p.longestAfter, stint)
		if id := st.GetOperation().GetId(); stint > stuckAfterFaults && !p.stuck[id] {
			p.stuck[id] = true
			p.t.Errorf("%6.1fs actor %s has been %s for %s after the faults stopped (operation %s started %s), want at most %s",
				now.Sub(p.begin).Seconds(), name, st.GetState(), stint.Round(time.Millisecond), id,
				st.GetOperation().GetStartTime().AsTime().Sub(p.begin).Round(time.Millisecond), stuckAfterFaults)
		}
	}
	return settled, nil
}

func (p *poller) faultsStopped(at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faultsEnd = at
}

// waitSettled waits until a poll finds no actor -ING (the workload has
// stopped, so one left is stuck).
func (p *poller) waitSettled(ctx context.Context) {
	p.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		settled, err := p.poll(ctx)
		if settled {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("actors still -ING 3 minutes after the workload stopped (%v): %v", err, p.c.listActors())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// longestStints says how long a step stayed -ING at most (and which), and
// at most after the faults stopped.
func (p *poller) longestStints() (during, after string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("%s (%s)", p.longest.Round(time.Millisecond), p.longestWhat), p.longestAfter.Round(time.Millisecond).String()
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count", name, s)
	}
	return n
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
