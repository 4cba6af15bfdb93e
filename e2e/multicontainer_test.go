package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// sidecarPort is where the pod example's sidecar serves.
const sidecarPort = "8081"

// podTemplate is the counter with the pod example's sidecar beside it in
// one sandbox: both mount the data volume, and the sidecar reaches the
// counter over localhost.
func podTemplate(t testing.TB, name string) *torporv1.Template {
	return counterTemplate(t, name, func(spec *torporv1.TemplateSpec) {
		spec.Containers = append(spec.Containers, &torporv1.Container{
			Name:           "sidecar",
			Image:          runtimetest.PodImage(t),
			Command:        []string{"/sidecar"},
			Env:            []*torporv1.EnvVar{{Name: "PORT", Value: sidecarPort}, {Name: "UPSTREAM", Value: "http://127.0.0.1:8080/"}},
			ReadinessProbe: &torporv1.Probe{HttpGet: &torporv1.HTTPGetAction{Path: "/readyz", Port: 8081}},
			Mounts:         []*torporv1.Mount{{Volume: "data", Path: "/data"}},
		})
	})
}

// getPort sends one request straight to port of the actor's worker.
func getPort(t *testing.T, a *torporv1.Actor, port string) string {
	t.Helper()
	resp, err := http.Get("http://" + net.JoinHostPort(a.GetStatus().GetWorker().GetIp(), port) + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET port %s of worker %s: %s %s", port, a.GetStatus().GetWorker().GetName(), resp.Status, body)
	}
	return strings.TrimSpace(string(body))
}

// TestSeveralContainers: a template of two containers runs them in one
// sandbox sharing the network and the durable volume, and a suspend and a
// resume on another worker keep both containers' memory.
func TestSeveralContainers(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	c.applyTemplate(podTemplate(t, "pod"))
	c.createActor("p1", "pod")

	first := c.mustResume("p1")
	// The counter counts its own requests, the sidecar its own; the
	// sidecar's answer carries the counter's, reached over localhost, and
	// the counter's line count includes the sidecar's lines in /data.
	want := []struct{ port, answer string }{
		{"8080", "count=1 lines=1"},
		{sidecarPort, "sidecar=1 count=2 lines=3"},
		{sidecarPort, "sidecar=2 count=3 lines=5"},
	}
	for _, w := range want {
		if got := getPort(t, first, w.port); got != w.answer {
			t.Fatalf("port %s: %q, want %q", w.port, got, w.answer)
		}
	}

	c.suspend("p1")
	// Another actor takes the freed worker, so p1 resumes on the other.
	c.createActor("blocker", "pod")
	c.mustResume("blocker")
	moved := c.mustResume("p1")
	if moved.GetStatus().GetWorker().GetName() == first.GetStatus().GetWorker().GetName() {
		t.Fatalf("p1 resumed on the same worker %s", moved.GetStatus().GetWorker().GetName())
	}
	// Both counts go on: memory of both containers came back.
	for _, w := range []struct{ port, answer string }{
		{sidecarPort, "sidecar=3 count=4 lines=7"},
		{"8080", "count=5 lines=8"},
	} {
		if got := getPort(t, moved, w.port); got != w.answer {
			t.Fatalf("after suspend and resume, port %s: %q, want %q", w.port, got, w.answer)
		}
	}

	c.pause("p1")
	back := c.mustResume("p1")
	if got, want := getPort(t, back, sidecarPort), fmt.Sprintf("sidecar=%d count=%d lines=%d", 4, 6, 10); got != want {
		t.Fatalf("after pause and resume: %q, want %q", got, want)
	}
}
