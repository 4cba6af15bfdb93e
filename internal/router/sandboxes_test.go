package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// createSandbox makes an actor as the E2B-compatible API makes a sandbox:
// named by its ID, with spec.sandbox set (which puts it in the sandbox
// index). CreateActor refuses spec.sandbox, so it is set in the store.
func (e *env) createSandbox(id string, autoResume bool) ActorKey {
	e.t.Helper()
	key := e.createActor(id, nil)
	ctx := context.Background()
	a, err := e.store.Actors().Get(ctx, key.Space, key.Name)
	if err != nil {
		e.t.Fatal(err)
	}
	a.Spec.Sandbox = &torporv1.Sandbox{AutoResume: autoResume, TimeoutSeconds: 300}
	if _, err := e.store.Actors().Update(ctx, a); err != nil {
		e.t.Fatalf("make actor %s a sandbox: %v", key, err)
	}
	return key
}

// sandboxRequest builds a request to port of sandbox id, by host name or,
// with headers, as the SDK sends it with E2B_SANDBOX_URL set to the
// router's address.
func (tr *testRouter) sandboxRequest(t testing.TB, method, id string, port int, headers bool, path string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, tr.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if headers {
		req.Header.Set(SandboxIDHeader, id)
		req.Header.Set(SandboxPortHeader, strconv.Itoa(port))
	} else {
		req.Host = fmt.Sprintf("%d-%s.%s", port, id, DefaultDomain)
	}
	return req
}

func (tr *testRouter) getSandbox(t testing.TB, id string, port int, headers bool, path string) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(tr.sandboxRequest(t, http.MethodGet, id, port, headers, path, nil))
	if err != nil {
		t.Fatalf("GET %s of sandbox %s port %d: %v", path, id, port, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// serveOnWorker serves h on another port of the worker the actor runs on,
// as a process in a sandbox listens on a port of its own choosing.
func (e *env) serveOnWorker(a *torporv1.Actor, h http.Handler) int {
	e.t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(a.GetStatus().GetWorker().GetIp(), "0"))
	if err != nil {
		e.t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	e.t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// wantSandbox502 checks an answer is E2B's for a sandbox that is not
// running: 502, a JSON body whose message names the sandbox and says want.
func wantSandbox502(t *testing.T, status int, body, id, want string) {
	t.Helper()
	var msg struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(body), &msg); err != nil {
		t.Fatalf("got %d %q, want a JSON body: %v", status, body, err)
	}
	if status != http.StatusBadGateway || msg.Code != http.StatusBadGateway || !strings.Contains(msg.Message, "sandbox "+id) || !strings.Contains(msg.Message, want) {
		t.Fatalf("got %d %q, want 502 with code 502 and a message naming sandbox %s and saying %q", status, body, id, want)
	}
}

// Any port of a running sandbox is reached, by <port>-<id>.<domain> and
// by the E2b-Sandbox-Id and E2b-Sandbox-Port headers.
func TestSandboxAnyPort(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createSandbox("sb1", false)
	a := e.resume(key)
	other := e.serveOnWorker(a, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "port server at %s, host %s", r.URL.Path, r.Host)
	}))
	tr := e.newRouter(Config{})
	for _, headers := range []bool{false, true} {
		for _, tt := range []struct {
			port int
			want string
		}{
			{e.port, "hello from sb1 at /x"},
			{other, "port server at /x"},
		} {
			t.Run(fmt.Sprintf("headers=%v/port=%d", headers, tt.port), func(t *testing.T) {
				if status, body := tr.getSandbox(t, "sb1", tt.port, headers, "/x"); status != http.StatusOK || !strings.HasPrefix(body, tt.want) {
					t.Fatalf("got %d %q, want 200 %q", status, body, tt.want)
				}
			})
		}
	}
	// A port nothing listens on is the sandbox's, not the router's.
	status, body := tr.getSandbox(t, "sb1", 1, false, "/")
	if status != http.StatusBadGateway || !strings.Contains(body, "sandbox sb1 did not answer: nothing accepts connections on port 1") {
		t.Fatalf("closed port: got %d %q", status, body)
	}
}

// A sandbox that is not running answers 502 and is not resumed by
// traffic, unless it was created with autoResume.
func TestSandboxNotRunning(t *testing.T) {
	tests := []struct {
		name       string
		autoResume bool
		stop       func(e *env, key ActorKey)
		wantState  string
	}{
		{name: "paused", stop: func(e *env, key ActorKey) { e.call("pause", e.actors.PauseActor, key) }, wantState: "paused, PAUSED"},
		{name: "suspended", stop: func(e *env, key ActorKey) { e.call("suspend", e.actors.SuspendActor, key) }, wantState: "paused, SUSPENDED"},
		{name: "paused, autoResume", autoResume: true, stop: func(e *env, key ActorKey) { e.call("pause", e.actors.PauseActor, key) }},
		{name: "suspended, autoResume", autoResume: true, stop: func(e *env, key ActorKey) { e.call("suspend", e.actors.SuspendActor, key) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 1, helloWorkload)
			key := e.createSandbox("sb1", tt.autoResume)
			e.resume(key)
			tr := e.newRouter(Config{})
			if status, body := tr.getSandbox(t, "sb1", e.port, false, "/"); status != http.StatusOK {
				t.Fatalf("running: got %d %q", status, body)
			}
			tt.stop(e, key)
			stopped := e.state(key)
			starts := e.agent.count("Run") + e.agent.count("Restore")
			for _, headers := range []bool{false, true} {
				status, body := tr.getSandbox(t, "sb1", e.port, headers, "/")
				if !tt.autoResume {
					wantSandbox502(t, status, body, "sb1", "is not running ("+tt.wantState+")")
					continue
				}
				if status != http.StatusOK || body != "hello from sb1 at /" {
					t.Fatalf("autoResume: got %d %q, want the sandbox's answer", status, body)
				}
			}
			switch got := e.state(key); {
			case !tt.autoResume && (got != stopped || e.agent.count("Run")+e.agent.count("Restore") != starts):
				t.Fatalf("the requests woke the sandbox: it is %s (was %s)", got, stopped)
			case tt.autoResume && got != torporv1.ActorState_ACTOR_STATE_RUNNING:
				t.Fatalf("autoResume: the sandbox is %s, want RUNNING", got)
			}
		})
	}
}

// An unknown sandbox, a deleted one and one of a space the router does
// not serve answer 502 naming the sandbox.
func TestSandboxNotFound(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createSandbox("sb1", true)
	e.resume(key)
	tr := e.newRouter(Config{})
	status, body := tr.getSandbox(t, "nosuch", 49983, false, "/")
	wantSandbox502(t, status, body, "nosuch", "not found")

	other := e.newRouter(Config{HTTPClient: e.routerClient("elsewhere")})
	status, body = other.getSandbox(t, "sb1", e.port, true, "/")
	wantSandbox502(t, status, body, "sb1", "not found")

	// Known to the router (cached), then killed.
	if status, body := tr.getSandbox(t, "sb1", e.port, false, "/"); status != http.StatusOK {
		t.Fatalf("running: got %d %q", status, body)
	}
	e.call("suspend", e.actors.SuspendActor, key)
	if _, err := e.actors.DeleteActor(context.Background(), connect.NewRequest(&torporv1.DeleteRequest{Space: key.Space, Name: key.Name})); err != nil {
		t.Fatal(err)
	}
	status, body = tr.getSandbox(t, "sb1", e.port, false, "/")
	wantSandbox502(t, status, body, "sb1", "not found")
}

// Only the sandbox index says which actor a sandbox ID is: an actor
// merely named like one (created after the sandbox of that ID was
// deleted, in its space, and running) does not get its traffic, and an
// actor named like a sandbox host is reached by its own host name.
func TestActorNamedLikeSandboxIsNotCaptured(t *testing.T) {
	e := newEnv(t, 2, helloWorkload)
	sb := e.createSandbox("sb1", true)
	sandboxUID := e.resume(sb).GetMetadata().GetUid()
	tr := e.newRouter(Config{})
	if status, body := tr.getSandbox(t, "sb1", e.port, false, "/"); status != http.StatusOK {
		t.Fatalf("running: got %d %q", status, body)
	}
	e.call("suspend", e.actors.SuspendActor, sb)
	if _, err := e.actors.DeleteActor(context.Background(), connect.NewRequest(&torporv1.DeleteRequest{Space: sb.Space, Name: sb.Name})); err != nil {
		t.Fatal(err)
	}
	// Recreated by its name as a plain actor, while the router still
	// holds the sandbox's entry (as it does until the watch reports the
	// deletion).
	impostor := e.createActor("sb1", nil)
	e.resume(impostor)
	waitFor(t, "the router to place the new actor", func() bool { _, ok := tr.actors.placement(impostor); return ok })
	tr.sandboxes.put(sandboxRef{id: "sb1", key: sb, uid: sandboxUID, autoResume: true})
	plain := e.createActor("8000-abc", nil)
	e.resume(plain)
	for _, headers := range []bool{false, true} {
		status, body := tr.getSandbox(t, "sb1", e.port, headers, "/")
		wantSandbox502(t, status, body, "sb1", "not found")
	}
	if status, body := tr.get(t, plain, "/"); status != http.StatusOK || body != "hello from 8000-abc at /" {
		t.Fatalf("actor %s by its host: got %d %q", plain, status, body)
	}
	if status, body := tr.getSandbox(t, "abc", 8000, false, "/"); status != http.StatusBadGateway {
		t.Fatalf("8000-abc.%s is sandbox abc's host, not actor %s's: got %d %q", DefaultDomain, plain, status, body)
	}
}

// A sandbox's responses stream: each write reaches the client as the
// workload makes it (the SDK's Connect streams of process output).
func TestSandboxStreamsUnbuffered(t *testing.T) {
	release := make(chan struct{})
	e := newEnv(t, 1, func(string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/connect+json")
			fmt.Fprint(w, "first\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
			fmt.Fprint(w, "second\n")
		})
	})
	key := e.createSandbox("sb1", false)
	e.resume(key)
	tr := e.newRouter(Config{})
	resp, err := http.DefaultClient.Do(tr.sandboxRequest(t, http.MethodPost, "sb1", e.port, true, "/process.Process/Start", strings.NewReader("{}")))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewReader(resp.Body)
	first := make(chan string, 1)
	go func() {
		line, _ := lines.ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if line != "first\n" {
			t.Fatalf("first line %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first write did not reach the client while the workload held the response open")
	}
	close(release)
	if rest, _ := io.ReadAll(lines); string(rest) != "second\n" {
		t.Fatalf("rest %q", rest)
	}
}

// An upgrade (WebSocket) to a sandbox's port passes through, by host and
// by headers, and counts as the sandbox's traffic while it is open.
func TestSandboxUpgradePassesThrough(t *testing.T) {
	e := newEnv(t, 1, echoUpgrade)
	key := e.createSandbox("sb1", false)
	e.resume(key)
	tr := e.newRouter(Config{})
	u, err := url.Parse(tr.url)
	if err != nil {
		t.Fatal(err)
	}
	for _, address := range []string{
		fmt.Sprintf("Host: %d-sb1.%s", e.port, DefaultDomain),
		fmt.Sprintf("Host: %s\r\n%s: sb1\r\n%s: %d", u.Host, SandboxIDHeader, SandboxPortHeader, e.port),
	} {
		t.Run(address, func(t *testing.T) {
			conn, err := net.Dial("tcp", u.Host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(15 * time.Second))
			fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\n%s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", address)
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("read upgrade response: %v", err)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("got %s, want 101", resp.Status)
			}
			if _, err := io.WriteString(conn, "ping"); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4)
			if _, err := io.ReadFull(br, got); err != nil || string(got) != "ping" {
				t.Fatalf("echo %q, %v", got, err)
			}
			tr.actors.mu.Lock()
			inflight := tr.actors.m[key].inflight
			tr.actors.mu.Unlock()
			if inflight != 1 {
				t.Errorf("in flight during the upgraded connection = %d, want 1", inflight)
			}
			conn.Close()
			waitFor(t, "the closed connection to leave", func() bool {
				tr.actors.mu.Lock()
				defer tr.actors.mu.Unlock()
				return tr.actors.m[key].inflight == 0
			})
		})
	}
}
