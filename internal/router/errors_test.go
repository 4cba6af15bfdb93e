package router

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// TestErrorBodiesRevealNothing: when a resume fails on the node or the
// workload does not answer, the client gets the status, what happened to
// the actor and a request id; the uid, sandbox, paths, worker and runtime
// output go only to the request's log line, under that id.
func TestErrorBodiesRevealNothing(t *testing.T) {
	tests := []struct {
		name       string
		wl         workload
		fail       connect.Code // how the node's Run fails; 0: it does not
		wantStatus int
		wantBody   string
		wantLog    []string // beyond the worker's address
	}{
		{
			name: "node fails the resume", wl: helloWorkload, fail: connect.CodeInternal,
			wantStatus: http.StatusBadGateway, wantBody: "actor default/app could not be resumed",
			wantLog: []string{"runsc exited 128", "/var/lib/torpor/bundles/", "worker w0"},
		},
		{
			name: "node refuses the resume", wl: helloWorkload, fail: connect.CodeFailedPrecondition,
			wantStatus: http.StatusConflict, wantBody: "actor default/app cannot be resumed now",
			wantLog: []string{"runsc exited 128", "/var/lib/torpor/bundles/", "worker w0"},
		},
		{
			name: "workload does not answer", wl: nil,
			wantStatus: http.StatusBadGateway, wantBody: "actor default/app did not answer",
			wantLog: []string{"connection refused"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 1, tt.wl)
			key := e.createActor("app", nil)
			if tt.fail != 0 {
				e.agent.failWith("Run", tt.fail)
			}
			var logs testkit.SyncBuffer
			tr := e.newRouter(Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
			resp, err := http.DefaultClient.Do(tr.request(t, http.MethodGet, key, "/", nil))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body, id := string(b), resp.Header.Get(RequestIDHeader)
			if resp.StatusCode != tt.wantStatus || !strings.Contains(body, tt.wantBody) {
				t.Fatalf("got %d %q, want %d saying %q", resp.StatusCode, body, tt.wantStatus, tt.wantBody)
			}
			if id == "" || !strings.Contains(body, "request id "+id) {
				t.Errorf("body %q does not give the request id of header %s (%q)", body, RequestIDHeader, id)
			}

			a, err := e.actors.GetActor(context.Background(), connect.NewRequest(&torporv1.GetRequest{Space: key.Space, Name: key.Name}))
			if err != nil {
				t.Fatal(err)
			}
			internals := append([]string{a.Msg.GetMetadata().GetUid(), e.agent.workerIP["w0"]}, tt.wantLog...)
			for _, s := range internals {
				if strings.Contains(body, s) {
					t.Errorf("body %q reveals %q", body, s)
				}
			}
			var line map[string]any
			waitFor(t, "the request's log line", func() bool {
				for _, l := range requestLines(t, &logs) {
					if l["request_id"] == id {
						line = l
						return true
					}
				}
				return false
			})
			logged, _ := json.Marshal(line)
			wantLogged := internals
			if tt.fail == 0 {
				wantLogged = internals[1:] // the proxy knows the address, not the uid
			}
			for _, s := range wantLogged {
				if !strings.Contains(string(logged), s) {
					t.Errorf("log line %s lacks %q", logged, s)
				}
			}
			if line["level"] != "WARN" && tt.wantStatus >= 500 {
				t.Errorf("log line %s: want level WARN for a %d", logged, tt.wantStatus)
			}
		})
	}
}

// TestDeletingActorIs409: a request for an actor being deleted is told so.
func TestDeletingActorIs409(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	ctx := context.Background()
	a, err := e.store.Actors().Get(ctx, key.Space, key.Name)
	if err != nil {
		t.Fatal(err)
	}
	a.Status.State = torporv1.ActorState_ACTOR_STATE_DELETING
	if _, err := e.store.Actors().Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	tr := e.newRouter(Config{})
	if status, body := tr.get(t, key, "/"); status != http.StatusConflict || !strings.Contains(body, "actor default/app is being deleted") {
		t.Fatalf("got %d %q, want 409 saying the actor is being deleted", status, body)
	}
}
