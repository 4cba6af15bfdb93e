package node

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/gvisor"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

// counterTemplate is the counter example's template: an in-memory count
// and one line per request in its durable volume "data".
func counterTemplate(pinned string) *torporv1.TemplateSpec {
	return &torporv1.TemplateSpec{
		SandboxClass: gvisor.Class,
		Containers: []*torporv1.Container{{
			Name:    "counter",
			Image:   pinned,
			Command: []string{"/counter"},
			Env:     []*torporv1.EnvVar{{Name: "PORT", Value: "8080"}, {Name: "DATA_DIR", Value: "/data"}},
			ReadinessProbe: &torporv1.Probe{
				HttpGet:        &torporv1.HTTPGetAction{Path: "/readyz", Port: 8080},
				TimeoutSeconds: 30,
			},
			Mounts: []*torporv1.Mount{{Volume: "data", Path: "/data"}},
		}},
		Volumes: []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
	}
}

// gvisorNode is a node agent on real runsc with its own bridge and subnet.
type gvisorNode struct {
	*running
	name     string
	stateDir string
	network  *netns.Network
	runtime  *gvisor.Runtime
	objects  *snapshot.DirStore
	registry *registry
}

// nodeNetwork returns a network config no other test on this host uses:
// a random bridge name and /24 subnet.
func nodeNetwork(t testing.TB, node string) netns.Config {
	t.Helper()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	second, err := rand.Int(rand.Reader, big.NewInt(40))
	if err != nil {
		t.Fatal(err)
	}
	return netns.Config{
		Node:   node,
		Bridge: "tn" + hex.EncodeToString(b),
		CIDR:   fmt.Sprintf("10.%d.%d.0/24", 200+second.Int64(), b[0]),
	}
}

func uniqueName(t testing.TB, prefix string) string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b)
}

// newGVisorNode starts an agent with two workers on runsc. cacheBytes
// bounds its snapshot cache: 1 makes every restore fetch and verify from
// storage, as on a node that did not take the snapshot.
func newGVisorNode(t testing.TB, cacheBytes int64, options ...func(*Config)) *gvisorNode {
	t.Helper()
	runtimetest.RequireRoot(t)
	runsc := runtimetest.Runsc(t)
	name := uniqueName(t, "n")
	stateDir := t.TempDir()
	network, err := netns.New(nodeNetwork(t, name))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := gvisor.New(gvisor.Config{ConfigureNetwork: netns.Configure, Runsc: runsc, RootDir: filepath.Join(stateDir, "gvisor"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	objects, err := snapshot.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	reg := newRegistry(t)
	n := &gvisorNode{name: name, stateDir: stateDir, network: network, runtime: rt, objects: objects, registry: reg}
	// Cleanups run last-in first-out: the agent stops first, then its
	// sandboxes and network go.
	t.Cleanup(func() {
		ctx := context.Background()
		for i := range 2 {
			if err := rt.Terminate(ctx, runtime.Slot{Name: WorkerName(name, i)}); err != nil {
				t.Errorf("terminate worker %d: %v", i, err)
			}
		}
		if err := rt.Close(ctx); err != nil {
			t.Errorf("close runtime: %v", err)
		}
		if err := network.TeardownAll(ctx); err != nil {
			t.Errorf("tear down network: %v", err)
		}
	})
	cfg := Config{
		Name: name, Workers: 2, Pool: "e2e", StateDir: stateDir,
		Runtime: rt, Snapshots: objects, Network: network, CacheBytes: cacheBytes,
		HeartbeatInterval: 100 * time.Millisecond, Images: runtimetest.ImagePolicy(t),
	}
	reg.join(t, &cfg)
	for _, o := range options {
		o(&cfg)
	}
	n.running = startAgent(t, reg, cfg)
	waitFor(t, "registration", func() bool { return reg.registration(name) != nil })
	return n
}

func (n *gvisorNode) worker(i int) string { return WorkerName(n.name, i) }

// ip is the address the registration gave worker i.
func (n *gvisorNode) ip(t testing.TB, i int) string {
	t.Helper()
	for _, w := range n.registry.registration(n.name).GetWorkers() {
		if w.GetMetadata().GetName() == n.worker(i) {
			return w.GetSpec().GetIp()
		}
	}
	t.Fatalf("worker %s not registered", n.worker(i))
	return ""
}

// counterClient keeps no connections: a worker's address is reused by the
// next sandbox, and one restored from a checkpoint even holds the TCP
// state of connections its original had, so a kept connection can hang.
var counterClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// get sends one request to the counter at ip.
func get(t testing.TB, ip string) string {
	t.Helper()
	return getPath(t, ip, "/")
}

// getPath answers the counter at ip's GET of path.
func getPath(t testing.TB, ip, path string) string {
	t.Helper()
	resp, err := counterClient.Get("http://" + ip + ":8080" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s%s: %s %q %v", ip, path, resp.Status, body, err)
	}
	return strings.TrimSpace(string(body))
}

func (n *gvisorNode) requestsLogLines(t testing.TB, actorUID string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.stateDir, "volumes", actorUID, "data", "requests.log"))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("\n"))
}

func workload(actorUID, actor string, tmpl *torporv1.TemplateSpec) *torporv1.Workload {
	return &torporv1.Workload{Space: "e2e", Actor: actor, ActorUid: actorUID, TemplateName: "counter", TemplateUid: "tmpl-1", Template: tmpl}
}

func (n *gvisorNode) checkpoint(t testing.TB, actorUID, opID string, worker int, scope torporv1.SnapshotScope, target torporv1.CheckpointTarget) *torporv1.SnapshotSource {
	t.Helper()
	location := "e2e/" + actorUID + "/" + opID
	resp, err := n.client.Checkpoint(context.Background(), connect.NewRequest(&torporv1.CheckpointRequest{
		Op: op(actorUID, opID, n.worker(worker)), Scope: scope, Target: target, Location: location,
	}))
	if err != nil {
		t.Fatalf("checkpoint %s of %s: %v", scope, actorUID, err)
	}
	if resp.Msg.GetLocation() != location || !resp.Msg.GetHasData() || resp.Msg.GetSizeBytes() <= 0 {
		t.Fatalf("checkpoint response %v: want location %s, data, a size", resp.Msg, location)
	}
	src := &torporv1.SnapshotSource{Location: location, ManifestDigest: resp.Msg.GetManifestDigest()}
	if target == torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL {
		src.Node = n.name
	}
	n.wantFree(t, worker)
	return src
}

func (n *gvisorNode) restore(t testing.TB, w *torporv1.Workload, opID string, worker int, scope torporv1.RestoreScope, snap, golden *torporv1.SnapshotSource) (*torporv1.RestoreResponse, error) {
	t.Helper()
	resp, err := n.client.Restore(context.Background(), connect.NewRequest(&torporv1.RestoreRequest{
		Op: op(w.GetActorUid(), opID, n.worker(worker)), Workload: w, Scope: scope, Snapshot: snap, Golden: golden,
	}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// wantFree checks that worker i holds no workload.
func (n *gvisorNode) wantFree(t testing.TB, i int) {
	t.Helper()
	st, err := n.client.Stats(context.Background(), connect.NewRequest(&torporv1.StatsRequest{Worker: n.worker(i)}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.GetRunning() || st.Msg.GetActorUid() != "" {
		t.Fatalf("worker %s: running=%v actor=%q, want free", n.worker(i), st.Msg.GetRunning(), st.Msg.GetActorUid())
	}
}

// TestGVisorEndToEnd moves the counter between workers through every
// checkpoint and restore scope on real runsc.
func TestGVisorEndToEnd(t *testing.T) {
	n := newGVisorNode(t, 1)
	ctx := context.Background()
	tmpl := counterTemplate(runtimetest.CounterImage(t))
	actor := workload("actor-a", "a", tmpl)
	ip0, ip1 := n.ip(t, 0), n.ip(t, 1)
	if ip0 == ip1 {
		t.Fatalf("both workers have IP %s", ip0)
	}

	run, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("actor-a", "op-run", n.worker(0)), Workload: actor}))
	if err != nil {
		t.Fatal(err)
	}
	if run.Msg.GetWorkerIp() != ip0 {
		t.Fatalf("Run answered worker IP %s, want %s", run.Msg.GetWorkerIp(), ip0)
	}
	for i := 1; i <= 3; i++ {
		if got, want := get(t, ip0), fmt.Sprintf("count=%d lines=%d", i, i); got != want {
			t.Fatalf("request %d: %q, want %q", i, got, want)
		}
	}

	var full *torporv1.SnapshotSource
	t.Run("FullToStorageRestoresOnTheOtherWorker", func(t *testing.T) {
		full = n.checkpoint(t, "actor-a", "op-full", 0, torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE)
		if _, err := os.Stat(filepath.Join(n.stateDir, "volumes", "actor-a")); !os.IsNotExist(err) {
			t.Fatalf("volumes of a checkpointed actor are still on the node: %v", err)
		}
		resp, err := n.restore(t, actor, "op-restore-full", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, full, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetWorkerIp() != ip1 {
			t.Fatalf("restored at %s, want %s", resp.GetWorkerIp(), ip1)
		}
		if got := get(t, ip1); got != "count=4 lines=4" {
			t.Fatalf("after FULL restore: %q, want count=4 lines=4", got)
		}
		if lines := n.requestsLogLines(t, "actor-a"); lines != 4 {
			t.Fatalf("requests.log has %d lines on the host, want 4", lines)
		}
	})

	t.Run("DataKeepsTheFileAndResetsTheCounter", func(t *testing.T) {
		data := n.checkpoint(t, "actor-a", "op-data", 1, torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA, torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE)
		if _, err := n.restore(t, actor, "op-restore-data", 0, torporv1.RestoreScope_RESTORE_SCOPE_DATA, data, nil); err != nil {
			t.Fatal(err)
		}
		if got := get(t, ip0); got != "count=1 lines=5" {
			t.Fatalf("after DATA restore: %q, want count=1 lines=5", got)
		}
	})

	t.Run("DataFromAFullCapture", func(t *testing.T) {
		// What a repointed actor gets: only the volumes of its FULL
		// snapshot (3 lines), not its memory.
		if _, err := n.client.Terminate(ctx, connect.NewRequest(&torporv1.TerminateRequest{Op: op("actor-a", "op-term-1", n.worker(0))})); err != nil {
			t.Fatal(err)
		}
		n.wantFree(t, 0)
		if _, err := n.restore(t, actor, "op-restore-data-of-full", 1, torporv1.RestoreScope_RESTORE_SCOPE_DATA, full, nil); err != nil {
			t.Fatal(err)
		}
		if got := get(t, ip1); got != "count=1 lines=4" {
			t.Fatalf("after DATA restore of the FULL snapshot: %q, want count=1 lines=4", got)
		}
	})

	t.Run("DataOnGolden", func(t *testing.T) {
		data := n.checkpoint(t, "actor-a", "op-data-2", 1, torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA, torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE)
		// The golden: a fresh boot of the template that served two
		// requests, so its memory is recognisable (count=2).
		golden := workload("tmpl-1", "golden-counter", tmpl)
		if _, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("tmpl-1", "op-golden-run", n.worker(0)), Workload: golden})); err != nil {
			t.Fatal(err)
		}
		get(t, ip0)
		get(t, ip0)
		goldenSrc := n.checkpoint(t, "tmpl-1", "op-golden-checkpoint", 0, torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE)
		if _, err := n.restore(t, actor, "op-restore-golden", 1, torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN, data, goldenSrc); err != nil {
			t.Fatal(err)
		}
		// Memory from the golden (count 2 → 3), file from the actor (4 → 5).
		if got := get(t, ip1); got != "count=3 lines=5" {
			t.Fatalf("after DATA_ON_GOLDEN restore: %q, want count=3 lines=5", got)
		}
	})

	t.Run("LocalCheckpoint", func(t *testing.T) {
		local := n.checkpoint(t, "actor-a", "op-pause", 1, torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL)
		if _, err := os.Stat(filepath.Join(n.stateDir, "local-trees", local.GetLocation(), "manifest.json")); err != nil {
			t.Fatalf("local checkpoint not kept on the node: %v", err)
		}
		if _, err := snapshot.ReadManifest(ctx, n.objects, local.GetLocation(), local.GetManifestDigest()); err == nil {
			t.Fatal("a local checkpoint was uploaded to snapshot storage")
		}
		if _, err := n.restore(t, actor, "op-resume-local", 0, torporv1.RestoreScope_RESTORE_SCOPE_FULL, local, nil); err != nil {
			t.Fatal(err)
		}
		if got := get(t, ip0); got != "count=4 lines=6" {
			t.Fatalf("after restoring the local checkpoint: %q, want count=4 lines=6", got)
		}
	})

	t.Run("TamperedSnapshotIsDataLoss", func(t *testing.T) {
		snap := n.checkpoint(t, "actor-a", "op-full-2", 0, torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE)
		object := objectOf(t, n.objects.Root(), snap.GetLocation(), dataArchive)
		body, err := os.ReadFile(object)
		if err != nil {
			t.Fatal(err)
		}
		body[len(body)/2] ^= 0xff
		if err := os.WriteFile(object, body, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = n.restore(t, actor, "op-restore-tampered", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, snap, nil)
		wantCode(t, err, connect.CodeDataLoss)
		if msg := err.Error(); !strings.Contains(msg, "file "+dataArchive) || !strings.Contains(msg, snap.GetLocation()) {
			t.Fatalf("DataLoss error %q does not name the file %s of %s", msg, dataArchive, snap.GetLocation())
		}
		n.wantFree(t, 1)
		// The intact first FULL snapshot still restores.
		if _, err := n.restore(t, actor, "op-restore-after-tamper", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, full, nil); err != nil {
			t.Fatal(err)
		}
		if got := get(t, ip1); got != "count=4 lines=4" {
			t.Fatalf("after restoring the first FULL snapshot: %q, want count=4 lines=4", got)
		}
	})

	t.Run("TerminateLeavesNothing", func(t *testing.T) {
		if _, err := n.client.Terminate(ctx, connect.NewRequest(&torporv1.TerminateRequest{Op: op("actor-a", "op-term-end", n.worker(1))})); err != nil {
			t.Fatal(err)
		}
		n.wantFree(t, 0)
		n.wantFree(t, 1)
		n.wantNoWorkloads(t)
	})
}

// objectOf returns the host path of a stored chunk of file path
// of the snapshot at location in a directory object store.
func objectOf(t testing.TB, storeRoot, location, path string) string {
	t.Helper()
	body, err := os.ReadFile(filepath.Join(storeRoot, location, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m snapshot.Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	for _, e := range m.Entries {
		if e.Path == path && len(e.Chunks) > 0 {
			return filepath.Join(storeRoot, filepath.FromSlash(e.Chunks[len(e.Chunks)/2].Key()))
		}
	}
	t.Fatalf("snapshot %s has no file %s", location, path)
	return ""
}

// wantNoWorkloads checks that nothing of a workload is left on the node:
// no sandbox runsc knows, no bundle, no mount under the state directory
// (but runsc's shared namespace mount), no volume directory.
func (n *gvisorNode) wantNoWorkloads(t testing.TB) {
	t.Helper()
	sandboxes, err := n.runtime.Sandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(sandboxes) > 0 {
		t.Errorf("sandboxes left: %v", sandboxes)
	}
	for _, m := range runtimetest.MountsUnder(t, n.stateDir) {
		if filepath.Base(m) != "null-netns" {
			t.Errorf("mount left: %s", m)
		}
	}
	if entries, err := os.ReadDir(filepath.Join(n.stateDir, "volumes")); err != nil || len(entries) > 0 {
		t.Errorf("volume directories left: %v %v", entries, err)
	}
	if procs := processesMentioning(t, n.stateDir); len(procs) > 0 {
		t.Errorf("processes left: %v", procs)
	}
}

// processesMentioning lists the command lines that contain s.
func processesMentioning(t testing.TB, s string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || e.Name() == fmt.Sprint(os.Getpid()) {
			continue
		}
		if line := string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})); strings.Contains(line, s) {
			out = append(out, e.Name()+": "+line)
		}
	}
	return out
}
