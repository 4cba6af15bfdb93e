package e2e

import (
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// TestUpObserved runs `torpor up` with tracing on and an actor woken from
// a snapshot through the router, then looks at it as an operator would:
// the trace of the activation in an OTLP collector (one trace from the
// router through the control plane to the node agent, with the phases),
// the one /metrics endpoint (labelled activation, node steps, build info
// once), and the dashboard in a real headless Chromium.
func TestUpObserved(t *testing.T) {
	runtimetest.RequireRoot(t)
	collector := startCollector(t)
	dataDir, configHome := shortTempDir(t), t.TempDir()
	api, routerAddr, metricsAddr := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	suffix := randomHex(3)
	n := &nodeProcess{
		name: "e2o-" + suffix, stateDir: filepath.Join(dataDir, "node"), workers: 2,
		network: netns.Config{Bridge: "to" + suffix, CIDR: fmt.Sprintf("10.%d.%d.0/24", 244+mrand.IntN(4), mrand.IntN(256))},
	}
	n.network.Node = n.name
	args := append([]string{"up", "--data-dir", dataDir, "--listen", api, "--router-listen", routerAddr, "--node-listen", testkit.FreeAddr(t),
		"--metrics-listen", metricsAddr, "--otlp-endpoint", "http://" + collector.addr,
		"--node-name", n.name, "--workers", "2", "--bridge", n.network.Bridge, "--cidr", n.network.CIDR, "--runsc", runtimetest.Runsc(t)},
		allowExamples(t)...)
	t.Setenv("XDG_CONFIG_HOME", configHome)
	n.process = startProcess(t, "up", args...)
	t.Cleanup(func() { n.removeLeftovers(t) })
	waitForOutput(t, n.process, "Torpor is up.")
	if out := tail(n.process.logPath, 8<<10); !strings.Contains(out, "https://"+api+"/dashboard/") {
		t.Errorf("the welcome names no dashboard URL:\n%s", out)
	}

	cli := func(args ...string) {
		t.Helper()
		cmd := exec.Command(torporBinary(t), args...)
		cmd.Dir = moduleRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("torpor %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	curl := func(actor string) {
		t.Helper()
		out, err := exec.Command("curl", "-sS", "--fail", "--max-time", "30", "-H", "Host: "+actor+".default.actors.localhost", "http://"+routerAddr+"/").CombinedOutput()
		if err != nil {
			t.Fatalf("curl %s: %v\n%s", actor, err, out)
		}
	}
	cli("template", "apply", "-f", "examples/counter/template.yaml", "--wait")
	cli("actor", "create", "c1", "--template", "counter")
	cli("actor", "create", "c2", "--template", "counter")
	curl("c1")
	cli("actor", "suspend", "c1")
	collector.reset()
	curl("c1") // the activation looked at below: FULL, from c1's snapshot

	t.Run("trace", func(t *testing.T) { checkActivationTrace(t, collector) })
	t.Run("metrics", func(t *testing.T) { checkUpMetrics(t, metricsAddr) })
	t.Run("dashboard", func(t *testing.T) {
		token, err := os.ReadFile(filepath.Join(dataDir, "admin-token"))
		if err != nil {
			t.Fatal(err)
		}
		checkDashboard(t, "https://"+api+"/dashboard/", strings.TrimSpace(string(token)), []string{"default/c1", "default/c2"})
	})
}

// collector is an OTLP/HTTP trace receiver: it keeps every span it is
// sent.
type collector struct {
	addr  string
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startCollector(t *testing.T) *collector {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{addr: ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				c.spans = append(c.spans, ss.GetSpans()...)
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return c
}

func (c *collector) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spans = nil
}

func (c *collector) snapshot() []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*tracepb.Span(nil), c.spans...)
}

// checkActivationTrace waits for the activation's trace: the router's
// request, its resume call, the control plane's handling of it and the
// node agent's restore with its steps, each under the one before.
func checkActivationTrace(t *testing.T, c *collector) {
	type want struct {
		name   string
		kind   tracepb.Span_SpanKind
		parent string // the name of an ancestor it must have
		attr   string // key=value it must carry
	}
	chain := []want{
		// First: it picks the trace, the FULL resume's.
		{"workflow.resume", tracepb.Span_SPAN_KIND_INTERNAL, "torpor.v1.ActorService/ResumeActor", "restore=FULL"},
		{"router.request", tracepb.Span_SPAN_KIND_INTERNAL, "", ""},
		{"router.resume", tracepb.Span_SPAN_KIND_INTERNAL, "router.request", ""},
		{"torpor.v1.ActorService/ResumeActor", tracepb.Span_SPAN_KIND_SERVER, "router.resume", ""},
		{"workflow.claim", tracepb.Span_SPAN_KIND_INTERNAL, "workflow.resume", ""},
		{"torpor.v1.NodeAgentService/Restore", tracepb.Span_SPAN_KIND_SERVER, "workflow.node", ""},
		{"node.fetch", tracepb.Span_SPAN_KIND_INTERNAL, "torpor.v1.NodeAgentService/Restore", ""},
		{"node.start", tracepb.Span_SPAN_KIND_INTERNAL, "torpor.v1.NodeAgentService/Restore", ""},
		{"workflow.finalize", tracepb.Span_SPAN_KIND_INTERNAL, "workflow.resume", ""},
		{"router.activation", tracepb.Span_SPAN_KIND_INTERNAL, "router.request", ""},
	}
	var problems []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		problems = nil
		spans := c.snapshot()
		byID := map[string]*tracepb.Span{}
		for _, s := range spans {
			byID[string(s.GetSpanId())] = s
		}
		hasAncestor := func(s *tracepb.Span, name string) bool {
			for p := byID[string(s.GetParentSpanId())]; p != nil; p = byID[string(p.GetParentSpanId())] {
				if p.GetName() == name {
					return true
				}
			}
			return false
		}
		var trace []byte
		for _, w := range chain {
			var found *tracepb.Span
			for _, s := range spans {
				if s.GetName() == w.name && s.GetKind() == w.kind && (trace == nil || string(s.GetTraceId()) == string(trace)) &&
					(w.parent == "" || hasAncestor(s, w.parent)) && (w.attr == "" || hasAttr(s, w.attr)) {
					found = s
					break
				}
			}
			if found == nil {
				problems = append(problems, fmt.Sprintf("no %s span %q under %q in the activation's trace", w.kind, w.name, w.parent))
				continue
			}
			trace = found.GetTraceId()
		}
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if len(problems) > 0 {
		var names []string
		for _, s := range c.snapshot() {
			names = append(names, s.GetName())
		}
		t.Fatalf("%s\nspans received: %v", strings.Join(problems, "\n"), names)
	}
}

func hasAttr(s *tracepb.Span, kv string) bool {
	k, v, _ := strings.Cut(kv, "=")
	for _, a := range s.GetAttributes() {
		if a.GetKey() == k && a.GetValue().GetStringValue() == v {
			return true
		}
	}
	return false
}

// checkUpMetrics reads up's one metrics endpoint: every part's metrics,
// the activation labelled with its template and restore, and the build
// information once.
func checkUpMetrics(t *testing.T, addr string) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	text := string(body)
	for _, want := range []string{
		`torpor_router_activation_seconds_count{restore="full",template="counter"} 1`,
		`torpor_workflow_steps_total{kind="resume",result="ok"}`,
		`torpor_workflow_steps_total{kind="suspend",result="ok"} 1`,
		`torpor_node_step_seconds_count{operation="checkpoint",step="upload"}`,
		`torpor_node_step_seconds_count{operation="start",step="fetch"}`,
		`torpor_snapshot_bytes_total{kind="suspend"}`,
		`torpor_workers{pool="default",state="busy"}`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if n := len(regexp.MustCompile(`(?m)^torpor_build_info\{`).FindAllString(text, -1)); n != 1 {
		t.Errorf("/metrics has %d torpor_build_info samples, want 1", n)
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", text)
	}
}

// checkDashboard logs in to the dashboard at url in headless Chromium
// (Debian's), waits for the actors to be listed and the latency chart to
// have points, opens the first actor's events and keeps a screenshot
// (dashboard.png in the test's artifact directory: go test -artifacts
// -outputdir DIR keeps it).
func checkDashboard(t *testing.T, url, token string, actors []string) {
	ctx := browser(t, 1280, 1000, 2*time.Minute)

	signIn(ctx, t, url, token)
	var steps []chromedp.Action[chromedp.Void]
	for _, a := range actors {
		steps = append(steps, chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`tr[data-actor=%q]`, a))))
	}
	steps = append(steps, chromedp.WaitVisible(chromedp.CSS("#latency-chart circle")))
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("dashboard at %s: %v", url, err)
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#actors tbody tr").length`))
	if err != nil {
		t.Fatal(err)
	}
	points, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#latency-chart circle").length`))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-actor=%q]`, actors[0]))),
		chromedp.WaitVisible(chromedp.CSS("#events li")),
	); err != nil {
		t.Fatalf("dashboard: %s's events: %v", actors[0], err)
	}
	events, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#events")))
	if err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.ArtifactDir(), "dashboard.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard screenshot: %s", path)
	if rows < len(actors) {
		t.Errorf("the actors table has %d rows, want %d", rows, len(actors))
	}
	if points < 2 {
		t.Errorf("the latency chart has %d points, want one per resume (2 at least)", points)
	}
	if !strings.Contains(events, "RESUMING → RUNNING") {
		t.Errorf("%s's events do not show its resume:\n%s", actors[0], events)
	}
}
