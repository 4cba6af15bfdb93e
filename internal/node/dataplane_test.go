package node

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime"
)

// TestDataPlaneOnTestRuntime: Exec relays a process's input, output and
// exit status and refuses an actor the worker does not host; Logs has the
// node's own record of the start; the running actor's use is in the
// metrics.
func TestDataPlaneOnTestRuntime(t *testing.T) {
	reg := prometheus.NewRegistry()
	n := newFakeNode(t, func(c *Config) { c.Registry = reg })
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-1", 0); err != nil {
		t.Fatal(err)
	}

	exec := func(actorUID string, process *torporv1.ExecProcess, input ...*torporv1.ExecInput) (string, int32, error) {
		t.Helper()
		stream := n.client.Exec(ctx)
		if err := stream.Send(&torporv1.ExecRequest{Worker: n.worker(0), ActorUid: actorUID, Process: process}); err != nil {
			t.Fatal(err)
		}
		for _, in := range input {
			if err := stream.Send(&torporv1.ExecRequest{Input: in}); err != nil {
				t.Fatal(err)
			}
		}
		stream.CloseRequest()
		var out strings.Builder
		for {
			msg, err := stream.Receive()
			if errors.Is(err, io.EOF) {
				return out.String(), 0, errors.New("no exit status")
			}
			if err != nil {
				return out.String(), 0, err
			}
			out.Write(msg.GetStdout())
			out.Write(msg.GetStderr())
			if msg.GetExit() != nil {
				return out.String(), msg.GetExit().GetCode(), nil
			}
		}
	}
	out, code, err := exec("a1", &torporv1.ExecProcess{Command: []string{"sh"}, Stdin: true},
		&torporv1.ExecInput{Stdin: []byte("echo hello\n")}, &torporv1.ExecInput{Stdin: []byte("exit 4\n"), CloseStdin: true})
	if err != nil || out != "hello\n" || code != 4 {
		t.Fatalf("exec sh: %q, exit %d, %v", out, code, err)
	}
	if out, code, err := exec("a1", &torporv1.ExecProcess{Command: []string{"nope"}}); err != nil || code != 127 || !strings.Contains(out, "nope") {
		t.Fatalf("exec of a missing command: %q, exit %d, %v", out, code, err)
	}
	if _, _, err := exec("a2", &torporv1.ExecProcess{Command: []string{"true"}}); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("exec in an actor the worker does not host: %v", err)
	}

	logs, err := n.client.Logs(ctx, connect.NewRequest(&torporv1.LogsRequest{Worker: n.worker(0), ActorUid: "a1"}))
	if err != nil {
		t.Fatal(err)
	}
	var recs []*torporv1.LogRecord
	for logs.Receive() {
		recs = append(recs, logs.Msg().GetRecords()...)
	}
	if err := logs.Err(); err != nil || len(recs) != 1 || !strings.HasPrefix(string(recs[0].GetText()), "started (cold boot) on node n1, worker "+n.worker(0)) {
		t.Fatalf("logs: %v, %v", texts(recs), err)
	}

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "actor" && l.GetValue() == "actor-a1" {
					found[f.GetName()] = true
				}
			}
		}
	}
	if !found["torpor_node_actor_cpu_seconds_total"] || !found["torpor_node_actor_memory_bytes"] {
		t.Fatalf("per-actor metrics of the running actor: %v", found)
	}
}

// TestLogsAcrossAgentRestart: what a workload writes while its agent is
// away waits in its FIFO, and the next agent, adopting the workload,
// reads it into the same log, whether the previous agent left it running
// or died in a checkpoint of it, before the capture began.
func TestLogsAcrossAgentRestart(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-1", 0); err != nil {
		t.Fatal(err)
	}
	fifo := runtime.OutputPath(filepath.Join(n.cfg.StateDir, "output", n.worker(0)), 0, "out")
	// The workload's end, opened as the runtime opens it and held for
	// the workload's life (the sandbox's processes hold it): a pipe no
	// process holds open any more drops what it held.
	workload, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer workload.Close()
	write := func(line string) {
		t.Helper()
		if _, err := workload.WriteString(line + "\n"); err != nil {
			t.Fatal(err)
		}
	}
	lines := func() []string {
		t.Helper()
		logs, err := n.client.Logs(ctx, connect.NewRequest(&torporv1.LogsRequest{Worker: n.worker(0), ActorUid: "a1", Container: "app"}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for logs.Receive() {
			for _, r := range logs.Msg().GetRecords() {
				out = append(out, string(r.GetText()))
			}
		}
		return out
	}
	write("before")
	waitFor(t, "the line before the restart", func() bool { return slices.Equal(lines(), []string{"before"}) })
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	// Written while no agent reads: it waits in the pipe.
	write("while away")
	n.start(t)
	write("after")
	waitFor(t, "the lines after the restart", func() bool {
		return slices.Equal(lines(), []string{"before", "while away", "after"})
	})

	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	// What an agent killed once a checkpoint's intent is on record
	// leaves: the capture on record, the sandbox running.
	record := filepath.Join(n.cfg.StateDir, "slots", n.worker(0)+".json")
	var rec slotRecord
	if err := readJSON(record, &rec); err != nil {
		t.Fatal(err)
	}
	rec.Phase, rec.Capture = phaseStopping, "op-suspend"
	if err := writeJSON(record, rec); err != nil {
		t.Fatal(err)
	}
	write("while away again")
	n.start(t)
	if st := n.stats(t, 0); !st.GetRunning() || st.GetActorUid() != "a1" {
		t.Fatalf("stats %v, want a1 adopted", st)
	}
	write("after the checkpoint cut short")
	waitFor(t, "the lines after the checkpoint cut short", func() bool {
		return slices.Equal(lines(), []string{"before", "while away", "after", "while away again", "after the checkpoint cut short"})
	})
}
