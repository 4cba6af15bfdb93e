package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// TestConnectionsSurviveNodeRestart runs `torpor node` as a process, whose
// slot gate is a process of its own, and holds an HTTP keep-alive
// connection, a CONNECT tunnel and a streaming response to a counter
// actor through `torpor router` (a process)
// across a kill -9 of the agent and its restart, and across a SIGTERM
// restart: neither is cut (the keep-alive connection is the one dialled
// first, all along; the stream goes on), requests keep succeeding, and new connections made
// while the agent is down reach the running actor. A gate killed under a
// running agent is started again (its connections lost: new ones work);
// a stop with no actor running leaves no gate process, and `torpor node
// --cleanup` stops the one a stop with an actor running leaves.
func TestConnectionsSurviveNodeRestart(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	local := c.nodes[0]
	remote := c.startNodeProcess(1)
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.holdWorkerOf(local.name, "counter")
	c.createActor("c1", "counter")
	if n := c.mustResume("c1").GetStatus().GetWorker().GetNode(); n != remote.name {
		t.Fatalf("c1 runs on node %q, want the agent process's node %s", n, remote.name)
	}
	c.ingress = "http://" + startRouterProcess(t, c, "gate-router")

	keepAlive, dials := countingClient()
	defer keepAlive.CloseIdleConnections()
	tunnel := openTunnel(t, c, "c1", 8080)
	defer tunnel.Close()
	stream := openStream(t, c, "c1")
	defer stream.close()
	check := func(when string) {
		t.Helper()
		stream.ticking(t, when)
		if got := routedCount(t, keepAlive, c, "c1"); !strings.HasPrefix(got, "count=") {
			t.Fatalf("%s: keep-alive request: %q", when, got)
		}
		if n := dials.Load(); n != 1 {
			t.Fatalf("%s: the keep-alive client dialled %d connections, want its first one only", when, n)
		}
		if got := tunnel.get(t); !strings.HasPrefix(got, "count=") {
			t.Fatalf("%s: request through the tunnel: %q", when, got)
		}
		fresh := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		if got := routedCount(t, fresh, c, "c1"); !strings.HasPrefix(got, "count=") {
			t.Fatalf("%s: request on a new connection: %q", when, got)
		}
	}
	check("before any restart")
	// Read now, checked after the restarts: the same gate all along.
	gatePID, _ := gatePIDOf(remote.stateDir)

	remote.kill()
	check("with the agent killed")
	remote.restart(c)
	check("after the agent's restart")

	stopNodeProcess(t, remote.process)
	check("with the agent stopped by SIGTERM")
	remote.process = startProcess(t, "node-"+remote.name+"-sigterm", remote.args...)
	remote.waitForHeartbeat(c, time.Now())
	check("after the agent's start")
	if pid := readGatePID(t, remote.stateDir); pid != gatePID {
		t.Fatalf("gate pid %d after the restarts, want the first one, %d", pid, gatePID)
	}

	// The gate killed: the agent starts another; its connections are lost.
	if err := syscall.Kill(gatePID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	fresh := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	c.waitFor("a new gate answering for c1", func() bool {
		pid, err := gatePIDOf(remote.stateDir)
		return err == nil && pid != gatePID && strings.HasPrefix(routedCount(t, fresh, c, "c1"), "count=")
	})

	// No actor running: the stop leaves no gate process.
	c.suspend("c1")
	stopNodeProcess(t, remote.process)
	if left := nodeLeftovers(t, remote); len(left) > 0 {
		t.Errorf("left after SIGTERM of a node running no actor:\n%s", strings.Join(left, "\n"))
	}

	// An actor running: the stop leaves the gate; --cleanup stops it.
	remote.process = startProcess(t, "node-"+remote.name+"-last", remote.args...)
	c.waitForWorkers(remote.name, remote.workers)
	c.mustResume("c1")
	stopNodeProcess(t, remote.process)
	pid := readGatePID(t, remote.stateDir)
	if left := strings.Join(nodeLeftovers(t, remote), "\n"); !strings.Contains(left, strconv.Itoa(pid)+": ") || !strings.Contains(left, " node gate ") {
		t.Errorf("what the harness sees left of a node stopped with an actor running:\n%s\nwant the gate process %d", left, pid)
	}
	out, err := exec.Command(torporBinary(t), "node", "--cleanup", "--name", remote.name, "--state-dir", remote.stateDir,
		"--bridge", remote.network.Bridge, "--cidr", remote.network.CIDR, "--runsc", runtimetest.Runsc(t)).CombinedOutput()
	if err != nil {
		t.Fatalf("torpor node --cleanup: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("removed slot gate process %d", pid); !strings.Contains(string(out), want) {
		t.Errorf("torpor node --cleanup said:\n%s\nwant %q", out, want)
	}
	if left := nodeLeftovers(t, remote); len(left) > 0 {
		t.Errorf("left after torpor node --cleanup:\n%s", strings.Join(left, "\n"))
	}
}

// countingClient is an HTTP client with keep-alive connections and the
// count of the connections it dialled: a keep-alive connection that
// survives dials no other.
func countingClient() (*http.Client, *atomic.Int32) {
	dials := &atomic.Int32{}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}, dials
}

// startRouterProcess runs `torpor router` joined as name, and returns its
// address once it listens.
func startRouterProcess(t *testing.T, c *cluster, name string) string {
	t.Helper()
	token, fingerprint := c.createJoinToken(&torporv1.CreateTokenRequest{
		Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_CLIENT_JOIN, Name: name, Role: torporv1.ClientRole_CLIENT_ROLE_ROUTER,
	})
	addr := testkit.FreeAddr(t)
	router := startProcess(t, name, "router", "--name", name, "--server", c.api, "--ca-fingerprint", fingerprint,
		"--state-dir", t.TempDir(), "--listen", addr, "--join-token", token)
	c.waitFor("router listening on "+addr, func() bool {
		if !router.running() {
			t.Fatalf("torpor router exited:\n%s", tail(router.logPath, 4<<10))
		}
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	return addr
}

// routedCount GETs / of actor through the router with hc and returns the
// body, or the status and body, or the error.
func routedCount(t *testing.T, hc *http.Client, c *cluster, actor string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.ingress+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = actor + ".default.actors.localhost"
	resp, err := hc.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	if resp.StatusCode != http.StatusOK {
		return resp.Status + " " + string(body)
	}
	return strings.TrimSpace(string(body))
}

// routedStream is the counter's /stream through the router, read as it
// comes.
type routedStream struct {
	body  io.Closer
	ticks atomic.Int64
	read  sync.WaitGroup
	// err is why the stream ended, once it did.
	err atomic.Pointer[error]
}

func openStream(t *testing.T, c *cluster, actor string) *routedStream {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.ingress+"/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = actor + ".default.actors.localhost"
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /stream of %s: %v %v", actor, resp, err)
	}
	s := &routedStream{body: resp.Body}
	s.read.Go(func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			s.ticks.Add(1)
		}
		err := sc.Err()
		if err == nil {
			err = io.EOF
		}
		s.err.Store(&err)
	})
	return s
}

// ticking fails unless the stream goes on: new lines within seconds.
func (s *routedStream) ticking(t *testing.T, when string) {
	t.Helper()
	before := s.ticks.Load()
	deadline := time.Now().Add(5 * time.Second)
	for s.ticks.Load() < before+3 {
		if err := s.err.Load(); err != nil {
			t.Fatalf("%s: the streaming response ended: %v", when, *err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the streaming response sent %d lines in 5 s", when, s.ticks.Load()-before)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *routedStream) close() {
	s.body.Close()
	s.read.Wait()
}

// routedTunnel is a CONNECT tunnel through the router to an actor's port,
// over which HTTP requests go one after the other.
type routedTunnel struct {
	net.Conn
	r *bufio.Reader
}

func openTunnel(t *testing.T, c *cluster, actor string, port int) *routedTunnel {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.ingress, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	authority := actor + ".default.actors.localhost:" + strconv.Itoa(port)
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer %s\r\n\r\n", authority, authority, c.conn.Token)
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT %s: %v %v", authority, resp, err)
	}
	return &routedTunnel{Conn: conn, r: r}
}

func (tu *routedTunnel) get(t *testing.T) string {
	t.Helper()
	_ = tu.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(tu, "GET / HTTP/1.1\r\nHost: counter\r\n\r\n"); err != nil {
		return err.Error()
	}
	resp, err := http.ReadResponse(tu.r, nil)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(body))
}

func gatePIDOf(stateDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, "gate.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func readGatePID(t *testing.T, stateDir string) int {
	t.Helper()
	pid, err := gatePIDOf(stateDir)
	if err != nil {
		t.Fatalf("the slot gate's pid file: %v", err)
	}
	return pid
}
