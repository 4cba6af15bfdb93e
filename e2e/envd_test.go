package e2e

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/torpor-dev/torpor/api/gen/envd/process"
	"github.com/torpor-dev/torpor/api/gen/envd/process/processconnect"
	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/envd"
	"github.com/torpor-dev/torpor/internal/node"
	"github.com/torpor-dev/torpor/internal/router"
)

// sandboxHeaders sets what the E2B SDK sends with E2B_SANDBOX_URL: the
// sandbox and its port in headers, and the access token.
type sandboxHeaders struct{ id, token string }

func (s sandboxHeaders) set(h http.Header) {
	h.Set(router.SandboxIDHeader, s.id)
	h.Set(router.SandboxPortHeader, strconv.Itoa(envd.Port))
	if s.token != "" {
		h.Set("X-Access-Token", s.token)
	}
}

func (s sandboxHeaders) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		s.set(req.Header())
		return next(ctx, req)
	}
}

func (s sandboxHeaders) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		s.set(conn.RequestHeader())
		return conn
	}
}

func (s sandboxHeaders) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// TestE2BSandboxInSandboxAPI: a sandbox made through SandboxService gets
// the in-sandbox API on any template (the counter's image has nothing
// else), reached through the router by the SDK's headers: it refuses a
// call without the access token, runs a process with the sandbox's env,
// and a background process keeps its pid and memory across a pause
// (suspend) and a connect.
func TestE2BSandboxInSandboxAPI(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite"})
	c.applyTemplate(counterTemplate(t, "base", nil))
	sandboxes := torporv1connect.NewSandboxServiceClient(c.http, c.api)
	created, err := sandboxes.CreateSandbox(c.ctx, connect.NewRequest(&torporv1.CreateSandboxRequest{
		Space: "default", Template: "base", Secure: true, Env: map[string]string{"SANDBOX_VAR": "from-create"}, TimeoutSeconds: 600,
	}))
	if err != nil {
		t.Fatal(err)
	}
	id, token := created.Msg.GetMetadata().GetName(), created.Msg.GetSpec().GetEnvdAccessToken()
	if token == "" {
		t.Fatal("a secure sandbox has no access token")
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	api := processconnect.NewProcessClient(hc, c.ingress, connect.WithProtoJSON(), connect.WithInterceptors(sandboxHeaders{id, token}))

	req, err := http.NewRequest(http.MethodGet, c.ingress+"/health", nil)
	if err != nil {
		t.Fatal(err)
	}
	sandboxHeaders{id: id}.set(req.Header)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health through the router: %s, want 204", resp.Status)
	}
	_, err = processconnect.NewProcessClient(hc, c.ingress, connect.WithProtoJSON(), connect.WithInterceptors(sandboxHeaders{id: id})).List(c.ctx, connect.NewRequest(&pb.ListRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("list without the access token: %v, want unauthenticated", err)
	}

	start := func(ctx context.Context, cfg *pb.ProcessConfig) (*connect.ServerStreamForClient[pb.StartResponse], uint32) {
		t.Helper()
		stream, err := api.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: cfg}))
		if err != nil {
			t.Fatal(err)
		}
		if !stream.Receive() {
			t.Fatalf("start %s: %v", cfg.GetCmd(), stream.Err())
		}
		return stream, stream.Msg().GetEvent().GetStart().GetPid()
	}
	helper := node.IdentityMountPath + "/.torpor-guest"
	stream, _ := start(c.ctx, &pb.ProcessConfig{Cmd: helper, Args: []string{"guest-files", "read", "/proc/self/environ"}})
	var environ string
	var end *pb.ProcessEvent_EndEvent
	for stream.Receive() {
		environ += string(stream.Msg().GetEvent().GetData().GetStdout())
		if e := stream.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if !strings.Contains(environ, "SANDBOX_VAR=from-create") || end.GetExitCode() != 0 {
		t.Fatalf("environment %q, end %v: want SANDBOX_VAR and exit 0 (stream %v)", environ, end, stream.Err())
	}

	bg, leave := context.WithCancel(c.ctx)
	_, pid := start(bg, &pb.ProcessConfig{Cmd: "/counter", Envs: map[string]string{"PORT": "9090", "DATA_DIR": "/tmp"}})
	leave()
	// The counter's count, through the router to port 9090 of the sandbox.
	count := func() string {
		t.Helper()
		for range 100 {
			req, err := http.NewRequest(http.MethodGet, c.ingress+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(router.SandboxIDHeader, id)
			req.Header.Set(router.SandboxPortHeader, "9090")
			resp, err := hc.Do(req)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return strings.Fields(string(b))[0]
				}
			}
			time.Sleep(100 * time.Millisecond) // not listening yet
		}
		t.Fatal("the background counter does not answer on port 9090")
		return ""
	}
	if got := count(); got != "count=1" {
		t.Fatalf("background counter: %q, want count=1", got)
	}
	c.suspend(id)
	if _, err := sandboxes.ConnectSandbox(c.ctx, connect.NewRequest(&torporv1.ConnectSandboxRequest{Space: "default", SandboxId: id})); err != nil {
		t.Fatal(err)
	}
	list, err := api.List(c.ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetPid() != pid || ps[0].GetConfig().GetCmd() != "/counter" {
		t.Fatalf("processes after pause and connect %v: want the background counter, pid %d", ps, pid)
	}
	if got := count(); got != "count=2" {
		t.Fatalf("background counter after pause and connect: %q, want count=2 (its memory)", got)
	}
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := api.SendSignal(c.ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
}
