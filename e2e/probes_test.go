package e2e

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// kvPort is where the pod example's kv server listens.
const kvPort = "6379"

// kvTemplate is the pod example's Redis-like server alone, starting to
// listen 1.5 s after it starts, with probe as its readiness probe.
func kvTemplate(t testing.TB, name string, probe *torporv1.Probe) *torporv1.Template {
	return &torporv1.Template{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: name},
		Spec: &torporv1.TemplateSpec{
			SandboxClass: "gvisor",
			Containers: []*torporv1.Container{{
				Name:           "kv",
				Image:          runtimetest.PodImage(t),
				Command:        []string{"/kv"},
				Env:            []*torporv1.EnvVar{{Name: "PORT", Value: kvPort}, {Name: "LISTEN_DELAY", Value: "1500ms"}},
				ReadinessProbe: probe,
			}},
		},
	}
}

// kv sends one command to the actor's kv server at once, without waiting
// for it to listen, and returns the reply's first line.
func kv(t *testing.T, a *torporv1.Actor, command string) string {
	t.Helper()
	conn, err := net.Dial("tcp", net.JoinHostPort(a.GetStatus().GetWorker().GetIp(), kvPort))
	if err != nil {
		t.Fatalf("kv on worker %s: %v", a.GetStatus().GetWorker().GetName(), err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(command + "\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("kv %s: %v", command, err)
	}
	return strings.TrimSpace(line)
}

// TestTCPSocketProbe: a TCP server with a tcpSocket probe is RUNNING only
// once it accepts connections, whether it was booted for the golden
// snapshot (which a new actor restores) or cold for a DATA resume; a FULL
// resume keeps its memory.
func TestTCPSocketProbe(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 1})
	tcp := &torporv1.Probe{TcpSocket: &torporv1.TCPSocketAction{Port: 6379}, TimeoutSeconds: 30}
	c.applyTemplate(kvTemplate(t, "kv", tcp))
	c.createActor("k1", "kv")
	// The golden snapshot was taken listening: the first connection, right
	// after RUNNING, is accepted.
	k1 := c.mustResume("k1")
	if got := kv(t, k1, "INCR hits"); got != ":1" {
		t.Fatalf("INCR after the first resume: %q, want :1", got)
	}
	c.suspend("k1")
	k1 = c.mustResume("k1")
	if got := kv(t, k1, "INCR hits"); got != ":2" {
		t.Fatalf("INCR after a FULL resume: %q, want :2", got)
	}
	c.suspend("k1")

	// Cold boots: a DATA snapshot resumes by booting the image again, and
	// the resume waits for the port.
	cold := kvTemplate(t, "kv-cold", tcp)
	cold.Spec.SnapshotPolicy = &torporv1.SnapshotPolicy{
		OnPause: torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA, OnCommit: torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA,
		OnResume: &torporv1.OnResume{FromData: torporv1.FromData_FROM_DATA_COLD_BOOT},
	}
	c.applyTemplate(cold)
	c.createActor("k2", "kv-cold")
	c.mustResume("k2")
	c.suspend("k2")
	k2 := c.mustResume("k2")
	events := c.events("k2")
	if r := events[len(events)-2].GetReason(); !strings.Contains(r, "DATA") || strings.Contains(r, "GOLDEN") {
		t.Fatalf("resume of a DATA snapshot: %q, want a DATA restore by cold boot", r)
	}
	if got := kv(t, k2, "PING"); got != "+PONG" {
		t.Fatalf("PING right after a cold resume: %q, want +PONG", got)
	}
}

// TestExecProbe: an exec probe runs a command in the container (the kv
// server's own client) until it exits 0, and a golden build whose exec
// probe never passes fails, naming the container and the probe.
func TestExecProbe(t *testing.T) {
	// Two workers: k1 keeps one while the second template is built.
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	c.applyTemplate(kvTemplate(t, "kv", &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/kv", "ping"}}, TimeoutSeconds: 30}))
	c.createActor("k1", "kv")
	k1 := c.mustResume("k1")
	if got := kv(t, k1, "PING"); got != "+PONG" {
		t.Fatalf("PING right after RUNNING: %q, want +PONG", got)
	}

	// Pings a port nothing listens on: never passes.
	broken := kvTemplate(t, "kv-broken", &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/kv", "ping", "127.0.0.1:1"}}, TimeoutSeconds: 3, PeriodSeconds: 1})
	if _, err := c.templates.CreateTemplate(c.ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: broken})); err != nil {
		t.Fatal(err)
	}
	var status *torporv1.TemplateStatus
	c.waitFor("the golden build of kv-broken to fail", func() bool {
		resp, err := c.templates.GetTemplate(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "kv-broken"}))
		if err != nil {
			t.Fatal(err)
		}
		status = resp.Msg.GetStatus()
		if status.GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_READY {
			t.Fatal("a template whose exec probe never passes was built")
		}
		return status.GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED
	})
	for _, want := range []string{"container kv", `readiness probe exec ["/kv" "ping" "127.0.0.1:1"]`, "connection refused"} {
		if !strings.Contains(status.GetMessage(), want) {
			t.Errorf("golden build failure %q does not say %q", status.GetMessage(), want)
		}
	}
}
