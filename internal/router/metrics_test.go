package router

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/metricstest"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// TestMetricsHelp: every router metric's HELP text names its labels.
func TestMetricsHelp(t *testing.T) {
	var r metricstest.Recorder
	if _, err := newMetrics(&r); err != nil {
		t.Fatal(err)
	}
	metricstest.HelpNamesLabels(t, r.Collectors...)
}

// requestLines are the router's "request" log lines written to logs.
func requestLines(t *testing.T, logs *testkit.SyncBuffer) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	return lines
}

func TestAccessLog(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	var logs testkit.SyncBuffer
	tr := e.newRouter(Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	_, first := tr.get(t, key, "/one")
	_, second := tr.get(t, key, "/two")
	// A line is written once the handler returns, which may be after the
	// client has read the whole answer.
	var lines []map[string]any
	waitFor(t, "two request log lines", func() bool { lines = requestLines(t, &logs); return len(lines) >= 2 })
	if len(lines) != 2 {
		t.Fatalf("%d request log lines, want 2", len(lines))
	}
	for i, want := range []struct {
		path    string
		bytes   int
		resumed bool
	}{{"/one", len(first), true}, {"/two", len(second), false}} {
		l := lines[i]
		if l["actor"] != "default/app" || l["method"] != "GET" || l["path"] != want.path || l["status"] != float64(200) || l["bytes"] != float64(want.bytes) {
			t.Errorf("line %d: %v", i, l)
		}
		if _, ok := l["duration"]; !ok {
			t.Errorf("line %d has no duration: %v", i, l)
		}
		if _, ok := l["resume"]; ok != want.resumed {
			t.Errorf("line %d: resume present %v, want %v: %v", i, ok, want.resumed, l)
		}
	}
}

func TestMetricsExposed(t *testing.T) {
	e := newEnv(t, 1, helloWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{AdminOnIngress: true})
	if status, _ := tr.get(t, key, "/"); status != http.StatusOK {
		t.Fatalf("actor request: %d", status)
	}
	// A request naming an actor reaches the actor, whatever its path.
	if status, body := tr.get(t, key, "/metrics"); status != http.StatusOK || body != "hello from app at /metrics" {
		t.Fatalf("actor's /metrics: %d %q", status, body)
	}
	for name, h := range map[string]func() (int, string){
		"ingress": func() (int, string) {
			resp, err := http.Get(tr.url + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		},
		"admin handler": func() (int, string) {
			rec := httptest.NewRecorder()
			tr.Admin().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			return rec.Code, rec.Body.String()
		},
	} {
		status, body := h()
		if status != http.StatusOK {
			t.Fatalf("%s: /metrics answered %d", name, status)
		}
		for _, want := range []string{
			`torpor_router_requests_total{code="200"} 2`,
			`torpor_router_resumes_total{result="running"} 1`,
			`torpor_router_resumes_total{result="no_worker"} 0`,
			`torpor_router_activation_seconds_count{restore="boot",template="t-app"} 1`,
			"torpor_router_parked_requests 0",
		} {
			if !strings.Contains(body, want) {
				t.Errorf("%s: /metrics lacks %q:\n%s", name, want, body)
			}
		}
	}

	// Without AdminOnIngress the ingress serves actors only.
	plain := e.newRouter(Config{})
	resp, err := http.Get(plain.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("/metrics on an ingress without admin: %d, want 400", resp.StatusCode)
	}
}
