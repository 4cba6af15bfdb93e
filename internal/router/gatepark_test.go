package router

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// echoWorkload answers with what it was sent, and echoes an upgraded
// connection.
func echoWorkload(actor string) http.Handler {
	upgrade := echoUpgrade(actor)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "" {
			upgrade.ServeHTTP(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s: %s %s %q", actor, r.Method, r.URL.Path, b)
	})
}

// answer reads resp whole: its status and body, or why not.
func answer(resp *http.Response, err error) (string, error) {
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, b), err
}

// upgradeEcho opens an upgraded connection to the actor and echoes one
// message over it.
func upgradeEcho(tr *testRouter, host string) (string, error) {
	u, err := url.Parse(tr.url)
	if err != nil {
		return "", err
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", host)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return answer(resp, nil)
	}
	io.WriteString(conn, "ping")
	got := make([]byte, 4)
	_, err = io.ReadFull(br, got)
	return "101 " + string(got), err
}

// TestRequestWaitsForItsGate: a request for a running actor whose node's
// slot gate is down (the node agent hosting it restarting) waits, parked,
// and is served once the gate is back, whatever it is; the actor is not
// started again for it.
func TestRequestWaitsForItsGate(t *testing.T) {
	tests := []struct {
		name    string
		sandbox bool
		send    func(e *env, tr *testRouter, key ActorKey) (string, error)
		want    string
	}{
		{name: "GET", want: `200 app: GET /a ""`, send: func(_ *env, tr *testRouter, key ActorKey) (string, error) {
			return answer(http.DefaultClient.Do(tr.request(t, http.MethodGet, key, "/a", nil)))
		}},
		{name: "POST with a body", want: `200 app: POST /b "payload"`, send: func(_ *env, tr *testRouter, key ActorKey) (string, error) {
			return answer(http.DefaultClient.Do(tr.request(t, http.MethodPost, key, "/b", strings.NewReader("payload"))))
		}},
		{name: "upgrade", want: "101 ping", send: func(_ *env, tr *testRouter, key ActorKey) (string, error) {
			return upgradeEcho(tr, key.Name+"."+key.Space+"."+DefaultDomain)
		}},
		{name: "tunnel", want: `200 app: GET /t ""`, send: func(e *env, tr *testRouter, key ActorKey) (string, error) {
			resp, conn := tr.connectTunnel(t, fmt.Sprintf("%s.%s.%s:%d", key.Name, key.Space, DefaultDomain, e.port),
				http.Header{"Proxy-Authorization": {"Bearer " + e.apiToken(testSpace)}})
			if conn == nil {
				return answer(resp, nil)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "GET /t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
			return answer(http.ReadResponse(bufio.NewReader(conn), nil))
		}},
		{name: "sandbox port", sandbox: true, want: `200 app: GET /s ""`, send: func(e *env, tr *testRouter, _ ActorKey) (string, error) {
			return answer(http.DefaultClient.Do(tr.sandboxRequest(t, http.MethodGet, "app", e.port, false, "/s", nil)))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 1, echoWorkload)
			var key ActorKey
			if tt.sandbox {
				key = e.createSandbox("app", false)
			} else {
				key = e.createActor("app", nil)
			}
			tr := e.newRouter(Config{ParkTimeout: 30 * time.Second})
			e.resume(key)
			waitFor(t, "the router to place the actor", func() bool { _, ok := tr.actors.placement(key); return ok })

			up := e.agent.gateDown()
			answered := make(chan string, 1)
			go func() {
				got, err := tt.send(e, tr, key)
				if err != nil {
					got = "error: " + err.Error()
				}
				answered <- got
			}()
			waitFor(t, "the request to wait for the gate", func() bool {
				return tr.metric(t, "torpor_router_gate_parked_requests_total", nil) == 1 && tr.metric(t, "torpor_router_parked_requests", nil) == 1
			})
			time.Sleep(300 * time.Millisecond) // a few tries
			select {
			case got := <-answered:
				t.Fatalf("answered %q while the gate was down, want a wait", got)
			default:
			}
			up()
			select {
			case got := <-answered:
				if got != tt.want {
					t.Fatalf("got %q, want %q", got, tt.want)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no answer after the gate came back")
			}
			if n := tr.metric(t, "torpor_router_parked_requests", nil); n != 0 {
				t.Errorf("%v requests still parked", n)
			}
			if n := e.agent.count("Run") + e.agent.count("Restore"); n != 1 {
				t.Errorf("the workload was started %d times, want once", n)
			}
			if got := e.state(key); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
				t.Errorf("actor is %s, want RUNNING", got)
			}
		})
	}
}

// TestGateDownPastParkBudget: a gate that stays down longer than the park
// bound gets the request a 503 with Retry-After, as a resume that cannot
// be had does.
func TestGateDownPastParkBudget(t *testing.T) {
	e := newEnv(t, 1, echoWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{ParkTimeout: 400 * time.Millisecond})
	if status, body := tr.get(t, key, "/"); status != http.StatusOK {
		t.Fatalf("before: %d %q", status, body)
	}
	e.agent.gateDown()
	start := time.Now()
	resp, err := http.DefaultClient.Do(tr.request(t, http.MethodGet, key, "/", nil))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Errorf("answered after %s, want the park bound", waited)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
		!strings.Contains(string(body), "actor default/app: the node it runs on does not answer, retry") {
		t.Fatalf("got %d (Retry-After %q) %q, want 503 saying the node does not answer", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if strings.Contains(string(body), "127.0.") {
		t.Errorf("body %q tells the client the gate's address", body)
	}
}

// TestCutRequestIsSentAgainOnlyWhenSafe: a request the workload's
// connection cut before any answer is sent once more when repeating it is
// safe (an idempotent method, or an Idempotency-Key, and a body the router
// still holds), and answered 502 otherwise; an answer begun is never
// repeated.
func TestCutRequestIsSentAgainOnlyWhenSafe(t *testing.T) {
	big := bytes.Repeat([]byte("x"), maxReplay+1)
	tests := []struct {
		name   string
		method string
		body   []byte
		header http.Header
		// started: the first answer starts before the cut.
		started  bool
		wantSent int32
		wantOK   bool
	}{
		{name: "GET", method: http.MethodGet, wantSent: 2, wantOK: true},
		{name: "HEAD", method: http.MethodHead, wantSent: 2, wantOK: true},
		{name: "PUT with a body", method: http.MethodPut, body: []byte("state"), wantSent: 2, wantOK: true},
		{name: "DELETE", method: http.MethodDelete, wantSent: 2, wantOK: true},
		{name: "POST", method: http.MethodPost, body: []byte("order"), wantSent: 1},
		{name: "PATCH", method: http.MethodPatch, body: []byte("order"), wantSent: 1},
		{name: "POST with an Idempotency-Key", method: http.MethodPost, body: []byte("order"), header: http.Header{"Idempotency-Key": {"k1"}}, wantSent: 2, wantOK: true},
		{name: "PUT with a body larger than the router keeps", method: http.MethodPut, body: big, wantSent: 1},
		{name: "GET whose answer had begun", method: http.MethodGet, started: true, wantSent: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sent atomic.Int32
			e := newEnv(t, 1, func(string) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					b, _ := io.ReadAll(r.Body)
					if sent.Add(1) > 1 {
						fmt.Fprintf(w, "%s %d bytes", r.Method, len(b))
						return
					}
					if tt.started {
						fmt.Fprint(w, "the first half")
						http.NewResponseController(w).Flush()
					}
					panic(http.ErrAbortHandler) // the connection is cut
				})
			})
			key := e.createActor("app", nil)
			tr := e.newRouter(Config{})
			e.resume(key)
			req := tr.request(t, tt.method, key, "/", bytes.NewReader(tt.body))
			for k, v := range tt.header {
				req.Header[k] = v
			}
			resp, err := http.DefaultClient.Do(req)
			got, err := answer(resp, err)
			switch {
			case tt.wantOK && (err != nil || resp.StatusCode != http.StatusOK):
				t.Errorf("got %q (%v), want 200", got, err)
			case !tt.wantOK && !tt.started && (err != nil || resp.StatusCode != http.StatusBadGateway):
				t.Errorf("got %q (%v), want 502", got, err)
			case tt.started && err == nil:
				t.Errorf("got %q whole, want the answer cut", got)
			}
			if tt.wantOK && tt.method != http.MethodHead && got != fmt.Sprintf("200 %s %d bytes", tt.method, len(tt.body)) {
				t.Errorf("got %q, want the workload's answer to the whole request", got)
			}
			if n := sent.Load(); n != tt.wantSent {
				t.Errorf("the workload got the request %d times, want %d", n, tt.wantSent)
			}
		})
	}
}
