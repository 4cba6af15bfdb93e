package e2e

import (
	"context"
	"io"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime"
)

// BenchmarkExec: `true` run in a running actor through the API (the
// control plane relaying to the node agent, which runs runsc exec),
// against the same runsc exec called on the node's runtime directly, in
// the same run, sample by sample.
func BenchmarkExec(b *testing.B) {
	c := newCluster(b, clusterOptions{backend: "sqlite"})
	c.applyTemplate(lineWriter(buildShellImage(b, b.TempDir())))
	c.createActor("c1", "lines")
	worker := c.mustResume("c1").GetStatus().GetWorker()
	var rt runtime.Runtime
	for _, n := range c.nodes {
		if n.name == worker.GetNode() {
			rt = n.runtime
		}
	}
	direct := func() {
		code, err := rt.ExecStream(c.ctx, runtime.Slot{Name: worker.GetName()}, runtime.ExecSpec{Command: []string{"/bin/sh", "-c", "true"}, Stdout: io.Discard, Stderr: io.Discard})
		if err != nil || code != 0 {
			b.Fatalf("runsc exec: %d, %v", code, err)
		}
	}
	api := func() {
		stream := c.actors.ExecActor(context.Background())
		if err := stream.Send(&torporv1.ExecActorRequest{Space: "default", Name: "c1", Process: &torporv1.ExecProcess{Command: []string{"/bin/sh", "-c", "true"}}}); err != nil {
			b.Fatal(err)
		}
		stream.CloseRequest()
		for {
			out, err := stream.Receive()
			if err != nil {
				b.Fatalf("exec through the API: %v", err)
			}
			if out.GetExit() != nil {
				if out.GetExit().GetCode() != 0 {
					b.Fatalf("exit %d", out.GetExit().GetCode())
				}
				stream.CloseResponse()
				return
			}
		}
	}
	// Warm both paths (connections, page cache) before timing.
	direct()
	api()
	// Interleaved, so both see the same load: the ratio is what counts.
	var directTime, apiTime time.Duration
	for b.Loop() {
		began := time.Now()
		direct()
		directTime += time.Since(began)
		began = time.Now()
		api()
		apiTime += time.Since(began)
	}
	b.ReportMetric(float64(directTime.Microseconds())/float64(b.N)/1000, "runsc-ms/op")
	b.ReportMetric(float64(apiTime.Microseconds())/float64(b.N)/1000, "api-ms/op")
	b.ReportMetric(float64(apiTime)/float64(directTime), "api/runsc")
}
