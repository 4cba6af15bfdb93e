package node

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/gvisor"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// TestAgentKilledDuringCheckpoint kills the agent process (SIGKILL) at
// each point of a suspend's checkpoint and retries the checkpoint, with
// the same operation id, on the restarted agent, as the control plane
// does while a node is unreachable: it must answer with a snapshot that
// restores the workload with its memory (the count goes on), whether the
// kill came before the capture (the sandbox still runs: it is adopted
// back and captured again, its output read again: what it writes then is
// in its log), while the sandbox saved itself (it finishes without its
// agent and exits), after the capture or after the upload.
func TestAgentKilledDuringCheckpoint(t *testing.T) {
	cfg, reg, _ := newKilledNode(t, "c")
	name := cfg.Name
	ctx := context.Background()
	tmpl := counterTemplate(runtimetest.CounterImage(t))
	actor := workload("actor-c", "c", tmpl)
	worker := 0
	p := spawn(t, cfg, reg, "")
	run, err := p.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("actor-c", "op-run", WorkerName(name, worker)), Workload: actor}))
	if err != nil {
		t.Fatal(err)
	}
	ip := run.Msg.GetWorkerIp()
	count := 0
	request := func() {
		t.Helper()
		count++
		if got, want := get(t, ip), fmt.Sprintf("count=%d lines=%d", count, count); got != want {
			t.Fatalf("request %d: %q, want %q", count, got, want)
		}
	}
	request()

	for _, point := range []string{"recorded", "capturing", "captured", "uploaded"} {
		// A fresh process for each point, with its kill armed.
		stopAgent(p)
		killed := cfg
		if point != "capturing" {
			killed.KillAt = point
		}
		p = spawn(t, killed, reg, p.address)
		request()
		opID := "op-suspend-" + point
		req := suspendRequest(name, "actor-c", opID, worker)
		answered := make(chan error, 1)
		go func() {
			_, err := p.client.Checkpoint(ctx, connect.NewRequest(req))
			answered <- err
		}()
		if point == "capturing" {
			// Once the sandbox writes its memory, it finishes without us.
			pages := filepath.Join(cfg.StateDir, "work", "actor-c", opID, memoryDir, "pages.img")
			waitFor(t, "the sandbox to save its memory", func() bool {
				fi, err := os.Stat(pages)
				return err == nil && fi.Size() > 0
			})
			p.cmd.Process.Signal(syscall.SIGKILL)
		}
		wantKilled(t, p, answered)

		p = spawn(t, cfg, reg, p.address)
		if point == "recorded" {
			// Killed before the capture began: the workload runs on.
			st, err := p.client.Stats(ctx, connect.NewRequest(&torporv1.StatsRequest{Worker: WorkerName(name, worker)}))
			if err != nil || !st.Msg.GetRunning() || st.Msg.GetActorUid() != "actor-c" {
				t.Fatalf("%s: after the restart: stats %v, %v; want actor-c running", point, st, err)
			}
			getPath(t, ip, "/print?line="+url.QueryEscape(adoptedLine))
		}
		resp, err := p.client.Checkpoint(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("%s: checkpoint retried on the restarted agent: %v", point, err)
		}
		if entries, err := os.ReadDir(filepath.Join(cfg.StateDir, "work")); err != nil || len(entries) > 0 {
			t.Errorf("%s: checkpoint stage left behind: %v %v", point, entries, err)
		}
		worker = 1 - worker
		snap := &torporv1.SnapshotSource{Location: req.GetLocation(), ManifestDigest: resp.Msg.GetManifestDigest()}
		restored, err := p.client.Restore(ctx, connect.NewRequest(&torporv1.RestoreRequest{
			Op: op("actor-c", "op-resume-"+point, WorkerName(name, worker)), Workload: actor,
			Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: snap,
		}))
		if err != nil {
			t.Fatalf("%s: restore: %v", point, err)
		}
		ip = restored.Msg.GetWorkerIp()
		request()
		if point == "recorded" {
			if lines := logLines(t, p, WorkerName(name, worker), "actor-c"); !slices.Contains(lines, "counter/stdout:"+adoptedLine) {
				t.Errorf("%s: the restored actor's log %q lacks the line its workload wrote once adopted", point, lines)
			}
		}
	}

	if _, err := p.client.Terminate(ctx, connect.NewRequest(&torporv1.TerminateRequest{Op: op("actor-c", "op-term", WorkerName(name, worker))})); err != nil {
		t.Fatal(err)
	}
	stopAgent(p)
	(&gvisorNode{stateDir: cfg.StateDir, runtime: cfg.mustGVisor(t)}).wantNoWorkloads(t)
}

// adoptedLine is what the workload of a checkpoint cut short writes
// once the restarted agent adopted it.
const adoptedLine = "written once adopted"

// logLines is the log of actorUID on worker, as texts.
func logLines(t *testing.T, p *agentProcess, worker, actorUID string) []string {
	t.Helper()
	logs, err := p.client.Logs(context.Background(), connect.NewRequest(&torporv1.LogsRequest{Worker: worker, ActorUid: actorUID}))
	if err != nil {
		t.Fatal(err)
	}
	var recs []*torporv1.LogRecord
	for logs.Receive() {
		recs = append(recs, logs.Msg().GetRecords()...)
	}
	if err := logs.Err(); err != nil {
		t.Fatalf("logs of actor %s: %v", actorUID, err)
	}
	return texts(recs)
}

// TestCaptureCutShortIsNotKept: a capture kept across a restart whose
// image is incomplete (the sandbox died while it saved itself) fails its
// retry as DataLoss and frees the worker; one the control plane no longer
// places on the node is removed at registration. Neither leaves a stage
// directory or volumes behind.
func TestCaptureCutShortIsNotKept(t *testing.T) {
	cfg, reg, _ := newKilledNode(t, "c")
	ctx := context.Background()
	actor := workload("actor-d", "d", counterTemplate(runtimetest.CounterImage(t)))
	killed := cfg
	killed.KillAt = "captured"
	p := spawn(t, killed, reg, "")
	// Killed after the capture of a suspend of the actor on worker w.
	suspendKilled := func(w int, opID string) *torporv1.CheckpointRequest {
		t.Helper()
		run, err := p.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("actor-d", "op-run-"+opID, WorkerName(cfg.Name, w)), Workload: actor}))
		if err != nil {
			t.Fatal(err)
		}
		get(t, run.Msg.GetWorkerIp())
		req := suspendRequest(cfg.Name, "actor-d", opID, w)
		answered := make(chan error, 1)
		go func() {
			_, err := p.client.Checkpoint(ctx, connect.NewRequest(req))
			answered <- err
		}()
		wantKilled(t, p, answered)
		return req
	}
	left := func() []string {
		var left []string
		for _, dir := range []string{"work", "volumes"} {
			if entries, err := os.ReadDir(filepath.Join(cfg.StateDir, dir)); err != nil || len(entries) > 0 {
				left = append(left, fmt.Sprintf("%s: %v %v", dir, entries, err))
			}
		}
		return left
	}
	wantGone := func(what string) {
		t.Helper()
		if l := left(); len(l) > 0 {
			t.Errorf("%s: left %v", what, l)
		}
	}

	req := suspendKilled(0, "op-suspend-cut")
	// Where a sandbox that dies while it saves itself stops writing.
	state := filepath.Join(cfg.StateDir, "work", "actor-d", "op-suspend-cut", memoryDir, "checkpoint.img")
	body, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(state, 16+int64(binary.BigEndian.Uint64(body[8:16]))); err != nil {
		t.Fatal(err)
	}
	// Still armed for the next suspend: the refused retry stops before
	// the kill.
	p = spawn(t, killed, reg, p.address)
	_, err = p.client.Checkpoint(ctx, connect.NewRequest(req))
	wantCode(t, err, connect.CodeDataLoss)
	st, err := p.client.Stats(ctx, connect.NewRequest(&torporv1.StatsRequest{Worker: WorkerName(cfg.Name, 0)}))
	if err != nil || st.Msg.GetRunning() || st.Msg.GetActorUid() != "" {
		t.Fatalf("after the failed retry: stats %v, %v; want the worker free", st, err)
	}
	wantGone("after the failed retry")

	suspendKilled(1, "op-suspend-orphan")
	// The control plane gave up on the actor meanwhile.
	reg.forget(cfg.Name, map[string]string{})
	p = spawn(t, cfg, reg, p.address)
	// The slot is free before the actor's volumes go (they go only once
	// it occupies none): wait for both.
	waitFor(t, "the orphaned capture to be removed", func() bool {
		st, err := p.client.Stats(ctx, connect.NewRequest(&torporv1.StatsRequest{Worker: WorkerName(cfg.Name, 1)}))
		return err == nil && st.Msg.GetActorUid() == "" && len(left()) == 0
	})
	stopAgent(p)
}

// newKilledNode configures a node agent process (named with prefix) on
// runsc, whose runtime and network are removed when the test ends, and
// returns that runtime too.
func newKilledNode(t *testing.T, prefix string) (helperConfig, *registry, *gvisor.Runtime) {
	runtimetest.RequireRoot(t)
	name := uniqueName(t, prefix)
	reg := newRegistry(t)
	cfg := helperConfig{
		Name: name, ServerURL: reg.url, StateDir: t.TempDir(), Snapshots: t.TempDir(),
		CAFingerprint: reg.ca.CAFingerprint(), JoinToken: reg.token(t, name),
		Runsc: runtimetest.Runsc(t), Network: nodeNetwork(t, name), ImageDirs: runtimetest.ImageDirs(t),
	}
	rt, err := cfg.gvisor()
	if err != nil {
		t.Fatal(err)
	}
	network, err := netns.New(cfg.Network)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for i := range 2 {
			rt.Terminate(ctx, runtime.Slot{Name: WorkerName(name, i)})
		}
		rt.Close(ctx)
		network.TeardownAll(ctx)
	})
	return cfg, reg, rt
}

func (c helperConfig) mustGVisor(t *testing.T) *gvisor.Runtime {
	rt, err := c.gvisor()
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// suspendRequest checkpoints actorUID FULL to storage out of worker.
func suspendRequest(node, actorUID, opID string, worker int) *torporv1.CheckpointRequest {
	return &torporv1.CheckpointRequest{
		Op: op(actorUID, opID, WorkerName(node, worker)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: "e2e/" + actorUID + "/" + opID,
	}
}

// stopAgent stops an agent process with SIGTERM.
func stopAgent(p *agentProcess) {
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.cmd.Wait()
}

// wantKilled waits for the agent process to die of SIGKILL and checks
// that its checkpoint call did not succeed.
func wantKilled(t *testing.T, p *agentProcess, answered <-chan error) {
	t.Helper()
	p.cmd.Wait()
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the agent exited with %v, want killed", p.cmd.ProcessState)
	}
	if err := <-answered; err == nil {
		t.Fatal("the checkpoint answered although its agent was killed")
	}
}
