package router

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
)

// helloWorkload answers every path with the actor's name, and echoes POST
// bodies at /echo.
func helloWorkload(actor string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s at %s", actor, r.URL.Path)
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		// Echo as the body arrives, so the router must stream both ways at
		// once.
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			panic(err)
		}
		if _, err := io.Copy(w, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	return mux
}

func TestRouterRejects(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	tr := e.newRouter(Config{})
	tests := []struct {
		name       string
		host       string
		header     string
		wantStatus int
		wantBody   string
	}{
		{name: "no actor", host: "localhost", wantStatus: http.StatusBadRequest, wantBody: "address it with Host: <actor>.<space>.actors.localhost or the header Torpor-Actor: <space>/<actor>"},
		{name: "bad header", host: "localhost", header: "nope", wantStatus: http.StatusBadRequest, wantBody: `"nope" is not <space>/<actor>`},
		{name: "bad host", host: "a.actors.localhost", wantStatus: http.StatusBadRequest, wantBody: "want <actor>.<space>.actors.localhost"},
		{name: "unknown actor by host", host: "ghost.default.actors.localhost", wantStatus: http.StatusNotFound, wantBody: "default/ghost"},
		{name: "unknown actor by header", host: "localhost", header: "default/ghost", wantStatus: http.StatusNotFound, wantBody: "default/ghost"},
		{name: "unknown space", host: "localhost", header: "nospace/ghost", wantStatus: http.StatusNotFound, wantBody: "nospace/ghost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, tr.url+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = tt.host
			if tt.header != "" {
				req.Header.Set(ActorHeader, tt.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.wantStatus || !strings.Contains(string(body), tt.wantBody) {
				t.Fatalf("got %d %q, want %d containing %q", resp.StatusCode, body, tt.wantStatus, tt.wantBody)
			}
		})
	}
	// A request the router cannot parse reaches no one; one to an actor
	// that does not exist asks the control plane once, to resume it.
	if n := e.callCount(torporv1connect.ActorServiceResumeActorProcedure); n != 3 {
		t.Errorf("rejected requests made %d ResumeActor calls, want 3 (one per unknown actor)", n)
	}
	if n := e.callCount(torporv1connect.ActorServiceGetActorProcedure); n != 0 {
		t.Errorf("rejected requests made %d GetActor calls, want 0", n)
	}
	for code, want := range map[string]float64{"400": 3, "404": 3} {
		if n := tr.metric(t, "torpor_router_requests_total", map[string]string{"code": code}); n != want {
			t.Errorf("requests_total{code=%s} = %v, want %v", code, n, want)
		}
	}
}

func TestConcurrentRequestsResumeOnce(t *testing.T) {
	const clients = 20
	e := newEnv(t, 2, helloWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{})
	// Hold the boot until every request is parked on the resume, so all 20
	// really arrive while the actor is not running.
	entered, release := e.agent.gate("Run")
	defer release()

	type answer struct {
		status int
		body   string
		err    error
	}
	answers := make(chan answer, clients)
	for range clients {
		go func() {
			resp, err := http.DefaultClient.Do(tr.request(t, http.MethodGet, key, "/x", nil))
			if err != nil {
				answers <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			answers <- answer{status: resp.StatusCode, body: string(b), err: err}
		}()
	}
	<-entered
	waitFor(t, "20 parked requests", func() bool { return tr.metric(t, "torpor_router_parked_requests", nil) == clients })
	release()
	for range clients {
		a := <-answers
		if a.err != nil || a.status != http.StatusOK || a.body != "hello from app at /x" {
			t.Fatalf("answer: %d %q %v", a.status, a.body, a.err)
		}
	}
	if n := e.callCount(torporv1connect.ActorServiceResumeActorProcedure); n != 1 {
		t.Errorf("ResumeActor called %d times, want 1", n)
	}
	if n := e.agent.count("Run"); n != 1 {
		t.Errorf("workload booted %d times, want 1", n)
	}
	if n := tr.metric(t, "torpor_router_resumes_total", map[string]string{"result": resumeRunning}); n != 1 {
		t.Errorf("resumes_total{result=running} = %v, want 1", n)
	}
	if n := tr.metric(t, "torpor_router_activation_seconds", nil); n != clients {
		t.Errorf("activation observations = %v, want %d", n, clients)
	}
	if n := tr.metric(t, "torpor_router_parked_requests", nil); n != 0 {
		t.Errorf("parked requests after the answers = %v, want 0", n)
	}
}

// occupyOnlyWorker resumes a second actor through the API so the only
// worker is busy.
func occupyOnlyWorker(t *testing.T, e *env) ActorKey {
	t.Helper()
	// Never idle, never evicted: it holds the worker until suspended.
	busy := e.createActor("busy", &torporv1.IdlePolicy{Eviction: &torporv1.EvictionPolicy{Never: true}})
	if _, err := e.actors.ResumeActor(context.Background(), connect.NewRequest(&torporv1.ResumeActorRequest{Space: busy.Space, Name: busy.Name})); err != nil {
		t.Fatalf("resume busy actor: %v", err)
	}
	return busy
}

func TestNoFreeWorkerAnswers503AfterParking(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	occupyOnlyWorker(t, e)
	key := e.createActor("app", nil)
	const park = 300 * time.Millisecond
	tr := e.newRouter(Config{ParkTimeout: park})

	start := time.Now()
	resp, err := http.DefaultClient.Do(tr.request(t, http.MethodGet, key, "/", nil))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	waited := time.Since(start)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("got %d (Retry-After %q) %q, want 503 with Retry-After 1", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if !strings.Contains(string(body), "no worker is free") {
		t.Errorf("body %q does not say why", body)
	}
	if waited < park {
		t.Errorf("answered after %s, before the park bound %s", waited, park)
	}
	if n := e.callCount(torporv1connect.ActorServiceResumeActorProcedure); n < 3 {
		t.Errorf("ResumeActor called %d times while parked, want retries", n-1)
	}
	if n := tr.metric(t, "torpor_router_resumes_total", map[string]string{"result": resumeNoWorker}); n != 1 {
		t.Errorf("resumes_total{result=no_worker} = %v, want 1", n)
	}
	// The control plane counts the refused request once, not each ask.
	resp, err = e.apiClient.Get(e.apiURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`torpor_workflow_steps_total{kind="resume",result="resource_exhausted"} 1`, "torpor_resume_no_worker_total 1"} {
		if !strings.Contains(string(page), want+"\n") {
			t.Errorf("control plane metrics lack %s", want)
		}
	}
}

func TestParkedRequestGetsWorkerFreedMeanwhile(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	busy := occupyOnlyWorker(t, e)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{ParkTimeout: 30 * time.Second})
	resumesBefore := e.callCount(torporv1connect.ActorServiceResumeActorProcedure)

	type answer struct {
		status int
		body   string
	}
	done := make(chan answer, 1)
	go func() {
		status, body := tr.get(t, key, "/")
		done <- answer{status, body}
	}()
	waitFor(t, "a retried resume", func() bool {
		return e.callCount(torporv1connect.ActorServiceResumeActorProcedure)-resumesBefore >= 2
	})
	select {
	case a := <-done:
		t.Fatalf("answered %d %q while no worker was free", a.status, a.body)
	default:
	}
	if _, err := e.actors.SuspendActor(context.Background(), connect.NewRequest(&torporv1.GetRequest{Space: busy.Space, Name: busy.Name})); err != nil {
		t.Fatalf("suspend busy actor: %v", err)
	}
	if a := <-done; a.status != http.StatusOK || a.body != "hello from app at /" {
		t.Fatalf("got %d %q, want the actor's answer", a.status, a.body)
	}
}

func TestResumeTimeoutAnswers504(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{ResumeTimeout: 200 * time.Millisecond})
	_, release := e.agent.gate("Run")
	defer release()

	if status, body := tr.get(t, key, "/"); status != http.StatusGatewayTimeout || !strings.Contains(body, "resume timed out") {
		t.Fatalf("got %d %q, want 504", status, body)
	}
	// The resume was not abandoned: once the boot finishes the actor runs.
	release()
	e.waitState(key, torporv1.ActorState_ACTOR_STATE_RUNNING)
	if status, body := tr.get(t, key, "/"); status != http.StatusOK || body != "hello from app at /" {
		t.Fatalf("after the boot: got %d %q", status, body)
	}
	if n := e.agent.count("Run"); n != 1 {
		t.Errorf("workload booted %d times, want 1", n)
	}
	if n := tr.metric(t, "torpor_router_resumes_total", map[string]string{"result": resumeTimeout}); n != 1 {
		t.Errorf("resumes_total{result=timeout} = %v, want 1", n)
	}
}

func TestWorkloadNotAnsweringIs502(t *testing.T) {
	tests := []struct {
		name string
		wl   workload
	}{
		{name: "nothing listens", wl: nil},
		{name: "connection reset", wl: func(string) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				conn, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					panic(err)
				}
				conn.(*net.TCPConn).SetLinger(0) // close with RST
				conn.Close()
			})
		}},
		{name: "closed without answer", wl: func(string) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				conn, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					panic(err)
				}
				conn.Close()
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 1, tt.wl)
			key := e.createActor("app", nil)
			tr := e.newRouter(Config{})
			for i := range 2 { // just resumed, then from the cache
				status, body := tr.get(t, key, "/")
				if status != http.StatusBadGateway || !strings.Contains(body, "actor default/app did not answer") {
					t.Fatalf("request %d: got %d %q, want 502", i, status, body)
				}
			}
			// A refused dial asks the control plane again where the actor
			// is; the answer is the same running workload, not a new one.
			if n := e.agent.count("Run"); n != 1 {
				t.Errorf("workload booted %d times, want 1", n)
			}
		})
	}
}

func TestStreamingPassesThrough(t *testing.T) {
	next := make(chan struct{})
	e := newEnv(t, 1, func(string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "first\n")
			http.NewResponseController(w).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
			fmt.Fprint(w, "second\n")
		})
	})
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{})
	resp, err := http.DefaultClient.Do(tr.request(t, http.MethodGet, key, "/stream", nil))
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
			t.Fatalf("first chunk %q", line)
		}
	case <-time.After(10 * time.Second):
		close(next)
		t.Fatal("the first chunk was held back until the workload went on")
	}
	close(next)
	if rest, err := io.ReadAll(lines); err != nil || string(rest) != "second\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
}

func TestRequestBodiesPassThrough(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{})
	payload := make([]byte, 1<<20)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		body func() io.Reader
	}{
		{name: "sized", body: func() io.Reader { return bytes.NewReader(payload) }},
		// A reader of unknown length is sent chunked.
		{name: "chunked", body: func() io.Reader {
			return io.MultiReader(bytes.NewReader(payload[:1000]), bytes.NewReader(payload[1000:]))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.DefaultClient.Do(tr.request(t, http.MethodPost, key, "/echo", tt.body()))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, payload) {
				t.Fatalf("got %d, %d bytes (equal: %v), %v", resp.StatusCode, len(got), bytes.Equal(got, payload), err)
			}
		})
	}
}

// echoUpgrade switches to a raw echo protocol on "Upgrade: websocket", as a
// WebSocket server switches to frames.
func echoUpgrade(string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "upgrade required", http.StatusUpgradeRequired)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		buf := make([]byte, 512)
		for {
			n, err := brw.Read(buf)
			if err != nil {
				return
			}
			if _, err := conn.Write(buf[:n]); err != nil {
				return
			}
		}
	})
}

func TestWebSocketUpgradePassesThrough(t *testing.T) {
	e := newEnv(t, 1, echoUpgrade)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{})
	u, err := url.Parse(tr.url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: app.default.%s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", DefaultDomain)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read upgrade response: %v", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
		t.Fatalf("got %s %v, want 101 to websocket", resp.Status, resp.Header)
	}
	for _, msg := range []string{"ping-1", "a longer second message"} {
		if _, err := io.WriteString(conn, msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
			t.Fatalf("echo %q, %v; want %q", got, err, msg)
		}
	}
	// An upgraded connection is traffic: the actor is busy while it is open.
	tr.actors.mu.Lock()
	inflight := tr.actors.m[key].inflight
	tr.actors.mu.Unlock()
	if inflight != 1 {
		t.Errorf("in flight during the upgraded connection = %d, want 1", inflight)
	}
}

func TestStaleEndpointIsResolvedAgain(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{})
	if status, body := tr.get(t, key, "/"); status != http.StatusOK {
		t.Fatalf("first request: %d %q", status, body)
	}
	// Someone else suspends the actor: the router's cached address now has
	// nothing listening.
	if _, err := e.actors.SuspendActor(context.Background(), connect.NewRequest(&torporv1.GetRequest{Space: key.Space, Name: key.Name})); err != nil {
		t.Fatal(err)
	}
	if status, body := tr.get(t, key, "/after"); status != http.StatusOK || body != "hello from app at /after" {
		t.Fatalf("request after the suspend: %d %q", status, body)
	}
	if n := e.callCount(torporv1connect.ActorServiceResumeActorProcedure); n != 2 {
		t.Errorf("ResumeActor called %d times, want 2", n)
	}
}

// TestBodyAndResponseStreamBothWays: the workload answers before the
// request body has ended (an interactive upload, a chat over one request),
// and the client sends the rest only after it has seen the answer begin.
func TestBodyAndResponseStreamBothWays(t *testing.T) {
	e := newEnv(t, 1, func(string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			if err := rc.EnableFullDuplex(); err != nil {
				panic(err)
			}
			br := bufio.NewReader(r.Body)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				fmt.Fprint(w, "got "+line)
				rc.Flush()
			}
		})
	})
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{})
	body, send := io.Pipe()
	defer send.Close()
	type answer struct {
		resp *http.Response
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(tr.request(t, http.MethodPost, key, "/chat", body))
		answered <- answer{resp, err}
	}()
	io.WriteString(send, "one\n")
	var resp *http.Response
	select {
	case a := <-answered:
		if a.err != nil {
			t.Fatal(a.err)
		}
		resp = a.resp
	case <-time.After(10 * time.Second):
		send.Close() // lets the stuck exchange end
		t.Fatal("no answer while the request body was still open")
	}
	defer resp.Body.Close()
	lines := bufio.NewReader(resp.Body)
	for _, msg := range []string{"one\n", "two\n", "three\n"} {
		if msg != "one\n" {
			io.WriteString(send, msg)
		}
		got, err := lines.ReadString('\n')
		if err != nil || got != "got "+msg {
			t.Fatalf("answer %q, %v; want %q", got, err, "got "+msg)
		}
	}
}

func TestClientLeavingDoesNotCancelTheSharedResume(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{})
	entered, release := e.agent.gate("Run")
	defer release()

	ctx, leave := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := http.DefaultClient.Do(tr.request(t, http.MethodGet, key, "/leaving", nil).WithContext(ctx))
		left <- err
	}()
	type answer struct {
		status int
		body   string
	}
	stayed := make(chan answer, 1)
	go func() {
		status, body := tr.get(t, key, "/staying")
		stayed <- answer{status, body}
	}()
	<-entered
	waitFor(t, "both requests parked", func() bool { return tr.metric(t, "torpor_router_parked_requests", nil) == 2 })
	leave()
	if err := <-left; err == nil {
		t.Fatal("the cancelled request got an answer")
	}
	waitFor(t, "the leaving request to stop waiting", func() bool { return tr.metric(t, "torpor_router_parked_requests", nil) == 1 })
	release()
	if a := <-stayed; a.status != http.StatusOK || a.body != "hello from app at /staying" {
		t.Fatalf("the staying request: %d %q", a.status, a.body)
	}
	if n := e.callCount(torporv1connect.ActorServiceResumeActorProcedure); n != 1 {
		t.Errorf("ResumeActor called %d times, want 1", n)
	}
	waitFor(t, "the leaving request to be counted", func() bool {
		return tr.metric(t, "torpor_router_requests_total", map[string]string{"code": "499"}) == 1
	})
}

// TestActorOutsideTheRoutersSpacesAnswers403: a router client limited to
// other spaces cannot reach the actor, and says so.
func TestActorOutsideTheRoutersSpacesAnswers403(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{HTTPClient: e.routerClient("elsewhere")})
	got, err := http.DefaultClient.Do(tr.request(t, http.MethodGet, key, "/", nil))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(got.Body)
	got.Body.Close()
	if got.StatusCode != http.StatusForbidden {
		t.Fatalf("got %d %q, want 403", got.StatusCode, body)
	}
}
