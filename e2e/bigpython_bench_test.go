package e2e

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/latency"
)

// BenchmarkBigPython: a Python actor holding a ~200 MB dict behind a tiny
// HTTP server (testdata/bigdict). Each iteration suspends it (FULL), waits
// for the agent to warm its worker (as for an actor idle long enough to be
// suspended), and times a request through the router until its answer
// arrives. Interleaved baseline: plain runsc checkpoint and restore of the
// same program holding the same dict.
//
//	go test ./e2e -run '^$' -bench BigPython -benchtime=5x -count=1 -timeout 30m
func BenchmarkBigPython(b *testing.B) {
	c := newCluster(b, clusterOptions{backend: "sqlite", workersPerNode: 2})
	tmpl := pythonTemplate(buildPythonImage(b, b.TempDir()))
	c.applyTemplate(tmpl)
	c.createActor("bigpy", "bigdict")
	req, client := routedHome(b, c, "bigpy")
	_, first := fetch(b, client, req)
	want := regexp.MustCompile(`^count=1 (entries=` + strconv.Itoa(bigPythonEntries) + ` sample=\{"id": \d+, .*\})$`).FindStringSubmatch(first)
	if want == nil {
		b.Fatalf("first answer of bigpy: %q", first)
	}
	raw := newRawSandbox(b, c, tmpl.GetSpec(), nil, httpReady)
	n := c.nodes[0]
	// The actor's count goes on across the runs of the sub-benchmark
	// (b.N=1 first).
	requests := 1

	b.Run("suspended", func(b *testing.B) {
		var suspend, activation, fetchStep, start, ready latency.Samples
		var rawCkpt, rawRestore, rawBackground latency.Samples
		var stored int64
		for range b.N {
			t0 := time.Now()
			s := c.suspend("bigpy")
			suspend.Add(time.Since(t0))
			stored = c.snapshotSize(b, s.GetStatus().GetLatestSnapshot())
			n.waitWarm(b)
			steps := c.stepSums(b)
			took, body := fetch(b, client, req)
			activation.Add(took)
			d := c.stepSums(b).minus(steps)
			fetchStep.Add(d["start/fetch"])
			start.Add(d["start/start"])
			ready.Add(d["start/ready"])
			requests++
			if w := fmt.Sprintf("count=%d %s", requests, want[1]); body != w {
				b.Fatalf("request %d after a suspend: %q, want %q", requests, body, w)
			}
			ck, rs, _ := raw.cycle(b, cyclePlain)
			rawCkpt.Add(ck)
			rawRestore.Add(rs)
			ck, rs, _ = raw.cycle(b, cycleBackground)
			rawCkpt.Add(ck)
			rawBackground.Add(rs)
		}
		suspend.Report(b, "suspend", 0.50, 0.95)
		activation.Report(b, "activation", 0.50, 0.95)
		rawCkpt.Report(b, "runsc-checkpoint", 0.50)
		rawRestore.Report(b, "runsc-restore", 0.50)
		rawBackground.Report(b, "runsc-restore-background", 0.50)
		for name, s := range map[string]latency.Samples{"fetch": fetchStep, "start": start, "ready": ready} {
			s.Report(b, "step-"+name, 0.50)
		}
		b.ReportMetric(suspend.Millis(0.50)/rawCkpt.Millis(0.50), "suspend/runsc-p50")
		b.ReportMetric(activation.Millis(0.50)/rawRestore.Millis(0.50), "activation/runsc-p50")
		b.ReportMetric(float64(stored)/1e6, "stored-MB")
		c.reportDisk(b)
	})

	// Each iteration: a pause cycle (pause, the worker warmed, then a
	// request that resumes it from the node's local checkpoint) and a
	// suspend cycle (suspend, the worker warmed, then a request),
	// interleaved, so the ratio is of one run. The node warms the worker
	// after either, as for an actor idle long enough.
	b.Run("pause-vs-suspend", func(b *testing.B) {
		var pause, pauseWake, suspend, suspendWake latency.Samples
		pauseSteps, suspendSteps := map[string]*latency.Samples{}, map[string]*latency.Samples{}
		addSteps := func(into map[string]*latency.Samples, d stepSums) {
			for k, v := range d {
				if v <= 0 {
					continue
				}
				if into[k] == nil {
					into[k] = &latency.Samples{}
				}
				into[k].Add(v)
			}
		}
		wake := func(after string) time.Duration {
			took, body := fetch(b, client, req)
			requests++
			if w := fmt.Sprintf("count=%d %s", requests, want[1]); body != w {
				b.Fatalf("request %d after a %s: %q, want %q", requests, after, body, w)
			}
			return took
		}
		for range b.N {
			steps := c.stepSums(b)
			t0 := time.Now()
			if st := c.pause("bigpy").GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_PAUSED {
				b.Fatalf("bigpy after its pause: %v", st)
			}
			pause.Add(time.Since(t0))
			n.waitWarm(b)
			pauseWake.Add(wake("pause"))
			addSteps(pauseSteps, c.stepSums(b).minus(steps))

			steps = c.stepSums(b)
			t0 = time.Now()
			c.suspend("bigpy")
			suspend.Add(time.Since(t0))
			n.waitWarm(b)
			suspendWake.Add(wake("suspend"))
			addSteps(suspendSteps, c.stepSums(b).minus(steps))
		}
		pause.Report(b, "pause", 0.50, 0.95)
		pauseWake.Report(b, "pause-activation", 0.50, 0.95)
		suspend.Report(b, "suspend", 0.50, 0.95)
		suspendWake.Report(b, "suspend-activation", 0.50, 0.95)
		for k, s := range pauseSteps {
			s.Report(b, "pause-step-"+strings.ReplaceAll(k, "/", "-"), 0.50)
		}
		for k, s := range suspendSteps {
			s.Report(b, "suspend-step-"+strings.ReplaceAll(k, "/", "-"), 0.50)
		}
		b.ReportMetric((pause.Millis(0.50)+pauseWake.Millis(0.50))/(suspend.Millis(0.50)+suspendWake.Millis(0.50)), "pause-cycle/suspend-cycle-p50")
	})
}

// buildPythonImage packs this machine's Debian python3.11 with the shared
// libraries it loads, the standard library modules testdata/bigdict
// imports (and those the interpreter loads at start), and the script,
// into an OCI layout under dir; it returns the pinned reference.
func buildPythonImage(b *testing.B, dir string) string {
	b.Helper()
	files := map[string]string{"/app/server.py": "testdata/bigdict/server.py"}
	stdlib := addPythonModules(b, files, "import os, socket")
	layout := filepath.Join(dir, "python-image")
	digest, err := image.BuildLayout(b.Context(), layout, image.LayoutSpec{
		Files: files,
		// lib-dynload marks the interpreter's platform directory; os.py
		// (above) its library.
		Dirs:   map[string]fs.FileMode{filepath.Join(stdlib, "lib-dynload"): 0o755, "/tmp": fs.ModeSticky | 0o777},
		Config: v1.Config{Entrypoint: []string{"/usr/bin/python3", "-I", "-S"}, Cmd: []string{"/app/server.py"}},
	})
	if err != nil {
		b.Fatal(err)
	}
	return image.LayoutScheme + layout + "@" + digest.String()
}

func pythonTemplate(pinned string) *torporv1.Template {
	return &torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "bigdict"}, Spec: &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers: []*torporv1.Container{{
			Name:    "py",
			Image:   pinned,
			Command: []string{"/usr/bin/python3", "-I", "-S", "/app/server.py"},
			Env: []*torporv1.EnvVar{
				{Name: "PORT", Value: "8080"},
				{Name: "ENTRIES", Value: strconv.Itoa(bigPythonEntries)},
			},
			ReadinessProbe: &torporv1.Probe{HttpGet: &torporv1.HTTPGetAction{Path: "/readyz", Port: 8080}, TimeoutSeconds: 120},
		}},
	}}
}
