package e2e

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/latency"
)

// BenchmarkE2BSDK times, with the published SDK (2.51) against `torpor
// up` on real gVisor, a sandbox's create, first command, pause, connect
// (resume) and the command after it (e2e/e2b/bench.mjs), over
// max(b.N, 5) rounds. The baseline of the same run is Torpor's own
// suspend and resume of an actor of the same template through the CLI,
// which E2B's pause and connect map onto.
//
//	go test -run '^$' -bench E2BSDK -benchtime=10x ./e2e
func BenchmarkE2BSDK(b *testing.B) {
	e := startE2B(b)
	rounds := max(b.N, 5)
	out, err := e.node("e2b", []string{"TORPOR_E2B_ROUNDS=" + strconv.Itoa(rounds)}, "bench.mjs")
	if err != nil {
		b.Fatalf("bench.mjs: %v\n%s", err, out)
	}
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	var steps map[string][]float64
	if err := json.Unmarshal(lines[len(lines)-1], &steps); err != nil {
		b.Fatalf("bench.mjs printed %q: %v", out, err)
	}
	for step, ms := range steps {
		var s latency.Samples
		for _, m := range ms {
			s.Add(time.Duration(m * float64(time.Millisecond)))
		}
		s.Report(b, "e2b-"+step, 0.5, 0.95)
	}

	e.up.cli("actor", "create", "baseline", "--template", "base")
	var suspend, resume latency.Samples
	for range rounds {
		start := time.Now()
		e.up.cli("actor", "suspend", "baseline")
		suspend.Add(time.Since(start))
		start = time.Now()
		e.up.cli("actor", "resume", "baseline")
		resume.Add(time.Since(start))
	}
	suspend.Report(b, "torpor-suspend", 0.5, 0.95)
	resume.Report(b, "torpor-resume", 0.5, 0.95)
}
