package e2e

import (
	"bufio"
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

// TestSnapshotStorageOutage stops the S3 server (a real one, s3test) for
// a suspend and for a resume. The suspend's capture ends the workload and
// then cannot be stored: the node answers unavailable and keeps it, the
// control plane repeats the call, and once the server is back the suspend
// finishes. The resume, on the node that did not take the snapshot, cannot
// download it and is repeated the same way. The actor is never CRASHED,
// and its count goes on.
func TestSnapshotStorageOutage(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", nodes: 2, workersPerNode: 1, s3: true})
	s3 := c.findS3Server()
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	if code, _, body := c.routerGet("c1"); code != http.StatusOK || body != "count=1 lines=1" {
		t.Fatalf("GET / of c1: %d %q, want count=1 lines=1", code, body)
	}
	node := c.actor("c1").GetStatus().GetWorker().GetNode()

	s3.stop()
	type outcome struct {
		actor *torporv1.Actor
		err   error
	}
	suspended := make(chan outcome, 1)
	go func() {
		resp, err := c.actors.SuspendActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "c1"}))
		if err != nil {
			suspended <- outcome{err: err}
			return
		}
		suspended <- outcome{actor: resp.Msg}
	}()
	// The step stays in flight while the node answers unavailable.
	whileDown := func(node, method string, want torporv1.ActorState) {
		t.Helper()
		c.waitFor(node+" to answer "+method+" unavailable", func() bool {
			if st := c.actor("c1").GetStatus().GetState(); st == torporv1.ActorState_ACTOR_STATE_CRASHED {
				t.Fatalf("c1 went CRASHED while snapshot storage is down: %s", c.actor("c1").GetStatus().GetCrashReason())
			}
			return c.nodeOperations(node, method, "unavailable") > 0
		})
		if st := c.actor("c1").GetStatus().GetState(); st != want {
			t.Fatalf("c1 while snapshot storage is down: %v, want %v", st, want)
		}
	}
	whileDown(node, "Checkpoint", torporv1.ActorState_ACTOR_STATE_SUSPENDING)
	s3.start()
	got := <-suspended
	if got.err != nil || got.actor.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("suspend of c1 across the outage: %v, %v; want SUSPENDED", got.actor.GetStatus().GetState(), got.err)
	}

	c.holdWorkerOf(node, "counter")
	s3.stop()
	resumed := make(chan outcome, 1)
	go func() {
		a, err := c.resume("c1", nil)
		resumed <- outcome{a, err}
	}()
	other := c.nodes[0].name
	if other == node {
		other = c.nodes[1].name
	}
	whileDown(other, "Restore", torporv1.ActorState_ACTOR_STATE_RESUMING)
	s3.start()
	got = <-resumed
	if got.err != nil || got.actor.GetStatus().GetWorker().GetNode() != other {
		t.Fatalf("resume of c1 across the outage: %v on %q; want it running on %s", got.err, got.actor.GetStatus().GetWorker().GetNode(), other)
	}
	if body := get(t, got.actor); body != "count=2 lines=2" {
		t.Fatalf("c1 after the resume: %q, want count=2 lines=2", body)
	}
	for _, ev := range c.events("c1") {
		if ev.GetToState() == torporv1.ActorState_ACTOR_STATE_CRASHED {
			t.Errorf("c1 went CRASHED: %s", ev.GetReason())
		}
	}
	c.checkReciprocal()
}

// s3Server is the S3 test server of a location s3test made, found by its
// listen address, so a test can stop it and start it again on the same
// address and data.
type s3Server struct {
	c    *cluster
	addr string
	argv []string
	pid  int
}

func (c *cluster) findS3Server() *s3Server {
	t := c.t
	t.Helper()
	cfg, err := snapshot.ParseS3Location(c.snapshotStorage)
	if err != nil {
		t.Fatal(err)
	}
	s := &s3Server{c: c, addr: cfg.Endpoint}
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		body, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		argv := strings.Split(strings.TrimSuffix(string(body), "\x00"), "\x00")
		if i := slices.Index(argv, "--port"); i > 0 && i+1 < len(argv) && argv[i+1] == s.addr && filepath.Base(argv[0]) == "versitygw" {
			s.argv = argv
			s.pid, _ = strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return s
		}
	}
	t.Fatalf("no S3 test server listens on %s", s.addr)
	return nil
}

// stop kills the server and waits until its address refuses connections.
func (s *s3Server) stop() {
	s.c.t.Helper()
	if err := syscall.Kill(s.pid, syscall.SIGKILL); err != nil {
		s.c.t.Fatalf("stop the S3 test server: %v", err)
	}
	s.waitForDial("the S3 test server to stop", false)
}

// start runs the server again with its arguments: same address, same
// directory, so the objects stored before it stopped are there.
func (s *s3Server) start() {
	s.c.t.Helper()
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	if err := cmd.Start(); err != nil {
		s.c.t.Fatalf("start the S3 test server: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() //nolint:errcheck // killed by the test
	s.c.t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	s.pid = cmd.Process.Pid
	s.waitForDial("the S3 test server to serve", true)
}

// waitForDial waits until a connection to the server succeeds (up) or is
// refused.
func (s *s3Server) waitForDial(what string, up bool) {
	s.c.t.Helper()
	s.c.waitFor(what, func() bool {
		conn, err := net.Dial("tcp", s.addr)
		if err == nil {
			conn.Close()
			return up
		}
		return !up && errors.Is(err, syscall.ECONNREFUSED)
	})
}

// nodeOperations reads, from node's /metrics, how many of its operations
// of method ended with result (a connect code, or ok).
func (c *cluster) nodeOperations(node, method, result string) float64 {
	c.t.Helper()
	n, err := c.nodeClient().GetNode(c.ctx, connect.NewRequest(&torporv1.GetRequest{Name: node}))
	if err != nil {
		c.t.Fatal(err)
	}
	// A node's certificate names it by SPIFFE ID, not by address.
	block, _ := pem.Decode(c.conn.CA)
	if block == nil {
		c.t.Fatal("the cluster's CA is not PEM")
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil || len(ca.URIs) != 1 {
		c.t.Fatalf("the cluster's CA names no trust domain: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   identity.ClientTLSConfig(nil, roots, identity.NodeID(ca.URIs[0].Host, node)),
		DisableKeepAlives: true,
	}}
	resp, err := client.Get(n.Msg.GetAddress() + "/metrics")
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	sample := []byte(`torpor_node_operations_total{method="` + method + `",result="` + result + `"} `)
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if v, ok := bytes.CutPrefix(lines.Bytes(), sample); ok {
			f, err := strconv.ParseFloat(string(v), 64)
			if err != nil {
				c.t.Fatal(err)
			}
			return f
		}
	}
	if err := lines.Err(); err != nil {
		c.t.Fatal(err)
	}
	return 0
}
