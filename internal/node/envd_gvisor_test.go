package node

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/torpor-dev/torpor/api/gen/envd/process"
	"github.com/torpor-dev/torpor/api/gen/envd/process/processconnect"
	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/envd"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

var staticTorpor struct {
	once sync.Once
	path string
	err  error
}

// staticTorporBinary builds torpor as make build does (static: the node
// runs it inside sandboxes), once per test process.
func staticTorporBinary(t testing.TB) string {
	t.Helper()
	staticTorpor.once.Do(func() {
		root, err := runtimetest.ModuleRoot()
		if err != nil {
			staticTorpor.err = err
			return
		}
		dir, err := os.MkdirTemp("", "torpor-node-test-bin-")
		if err != nil {
			staticTorpor.err = err
			return
		}
		path := filepath.Join(dir, "torpor")
		cmd := exec.Command("go", "build", "-o", path, "./cmd/torpor")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			staticTorpor.err = fmt.Errorf("go build ./cmd/torpor: %w: %s", err, out)
			return
		}
		staticTorpor.path = path
	})
	if staticTorpor.err != nil {
		t.Fatal(staticTorpor.err)
	}
	return staticTorpor.path
}

// envdClient speaks to the daemon at ip as the E2B SDK does (Connect,
// JSON), with token.
func envdClient(ip, token string) processconnect.ProcessClient {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	return processconnect.NewProcessClient(hc, fmt.Sprintf("http://%s:%d", ip, envd.Port), connect.WithProtoJSON(),
		connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				if token != "" {
					req.Header().Set("X-Access-Token", token)
				}
				return next(ctx, req)
			}
		})))
}

// startProcess starts cfg with token and returns the stream after its
// start event, and the pid.
func startProcess(t *testing.T, ctx context.Context, ip, token string, cfg *pb.ProcessConfig) (*connect.ServerStreamForClient[pb.StartResponse], uint32) {
	t.Helper()
	req := connect.NewRequest(&pb.StartRequest{Process: cfg})
	req.Header().Set("X-Access-Token", token)
	stream, err := envdClient(ip, token).Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatalf("start %s: %v", cfg.GetCmd(), stream.Err())
	}
	return stream, stream.Msg().GetEvent().GetStart().GetPid()
}

// TestGVisorEnvd: an E2B sandbox on real runsc gets the in-sandbox API
// from the node, on an image that has nothing but its program (the
// counter's): it refuses calls without the access token, runs processes
// with the sandbox's env and streams their output and exit status, and a
// background process it started survives a suspend (FULL checkpoint) and
// a restore on another worker with its pid and its memory, where the
// restored daemon (not a new one) still knows it and can kill it.
func TestGVisorEnvd(t *testing.T) {
	n := newGVisorNode(t, 1, func(c *Config) { c.GuestHelper = staticTorporBinary(t) })
	ctx := context.Background()
	const token = "envd-secret"
	w := workload("actor-e", "e", counterTemplate(runtimetest.CounterImage(t)))
	w.Envd, w.EnvdAccessToken, w.Env = true, token, map[string]string{"SANDBOX_VAR": "from-create"}
	if _, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("actor-e", "op-run", n.worker(0)), Workload: w})); err != nil {
		t.Fatal(err)
	}
	ip0, ip1 := n.ip(t, 0), n.ip(t, 1)

	resp, err := counterClient.Get(fmt.Sprintf("http://%s:%d/health", ip0, envd.Port))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health: %s, want 204", resp.Status)
	}
	_, err = envdClient(ip0, "").List(ctx, connect.NewRequest(&pb.ListRequest{}))
	wantCode(t, err, connect.CodeUnauthenticated)

	// The daemon's own binary is the one program the image has besides
	// the counter: its file helper prints its environment, and the
	// daemon's usage error is an exit status and stderr.
	helper := IdentityMountPath + "/" + guestHelperName
	stream, _ := startProcess(t, ctx, ip0, token, &pb.ProcessConfig{Cmd: helper, Args: []string{"guest-files", "read", "/proc/self/environ"}, Envs: map[string]string{"CALL_VAR": "from-call"}})
	var stdout string
	for stream.Receive() {
		stdout += string(stream.Msg().GetEvent().GetData().GetStdout())
	}
	for _, want := range []string{"SANDBOX_VAR=from-create", "CALL_VAR=from-call", "PORT=8080"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("process environment %q lacks %s", stdout, want)
		}
	}
	stream, _ = startProcess(t, ctx, ip0, token, &pb.ProcessConfig{Cmd: helper, Args: []string{"envd", "bogus"}})
	var stderr string
	var end *pb.ProcessEvent_EndEvent
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		stderr += string(ev.GetData().GetStderr())
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	if end.GetExitCode() != 2 || !strings.Contains(stderr, "usage") {
		t.Fatalf("exit %v, stderr %q: want status 2 and the usage", end, stderr)
	}

	// A background process with memory: a second counter on 9090.
	bg, cancelBG := context.WithCancel(ctx)
	_, pid := startProcess(t, bg, ip0, token, &pb.ProcessConfig{Cmd: "/counter", Envs: map[string]string{"PORT": "9090"}})
	cancelBG() // the client leaves; the process stays
	getPort := func(ip string) string {
		t.Helper()
		for range 100 {
			resp, err := counterClient.Get("http://" + ip + ":9090/")
			if err != nil {
				time.Sleep(100 * time.Millisecond) // not listening yet
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return strings.Fields(string(b))[0]
		}
		t.Fatalf("nothing answers on %s:9090", ip)
		return ""
	}
	if got := getPort(ip0); got != "count=1" {
		t.Fatalf("background counter: %q, want count=1", got)
	}
	if got := getPort(ip0); got != "count=2" {
		t.Fatalf("background counter: %q, want count=2", got)
	}

	list, err := envdClient(ip0, token).List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != pid || ps[0].GetConfig().GetCmd() != "/counter" {
		t.Fatalf("processes %v: want the background counter, pid %d", ps, pid)
	}

	full := n.checkpoint(t, "actor-e", "op-suspend", 0, torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE)
	if _, err := n.restore(t, w, "op-resume", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, full, nil); err != nil {
		t.Fatal(err)
	}
	list, err = envdClient(ip1, token).List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != pid {
		t.Fatalf("processes after the restore %v: want the background counter, pid %d", ps, pid)
	}
	if got := getPort(ip1); got != "count=3" {
		t.Fatalf("background counter after the restore: %q, want count=3 (its memory)", got)
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	creq := connect.NewRequest(&pb.ConnectRequest{Process: sel})
	creq.Header().Set("X-Access-Token", token) // the client's interceptor covers unary calls only
	conn, err := envdClient(ip1, token).Connect(ctx, creq)
	if err != nil {
		t.Fatal(err)
	}
	if !conn.Receive() || conn.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect to pid %d after the restore: %v %v", pid, conn.Msg(), conn.Err())
	}
	if _, err := envdClient(ip1, token).SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	end = nil
	for conn.Receive() {
		if e := conn.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if end == nil || end.GetExited() {
		t.Fatalf("end of the killed counter: %v (%v)", end, conn.Err())
	}
	// The container's own process still runs under the supervisor.
	if got := get(t, ip1); !strings.HasPrefix(got, "count=1 ") {
		t.Fatalf("the template's counter after the restore: %q", got)
	}
}
