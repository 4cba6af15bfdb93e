package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/minio/minio-go/v7"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

// faultyStore is snapshot storage whose writes or reads fail, as they do
// from S3 storage that is briefly out of reach or overloaded, while a
// fault is set for them.
type faultyStore struct {
	snapshot.ObjectStore
	mu     sync.Mutex
	faults map[string]error // by method: Put, Get
}

// errNoAnswer is the fault of a store that takes requests and does not
// answer them: the call waits until its context ends.
var errNoAnswer = errors.New("no answer")

// fail makes the store's method fail with err from now on; nil ends it.
func (f *faultyStore) fail(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.faults == nil {
		f.faults = map[string]error{}
	}
	f.faults[method] = err
}

func (f *faultyStore) fault(ctx context.Context, method, key string) error {
	f.mu.Lock()
	err := f.faults[method]
	f.mu.Unlock()
	if errors.Is(err, errNoAnswer) {
		<-ctx.Done()
		// As the S3 client reports a request its context ended.
		err = &url.Error{Op: method, URL: "http://127.0.0.1:9000/snapshots/" + key, Err: ctx.Err()}
	}
	if err != nil {
		// As the S3 store names the object.
		return fmt.Errorf("%s %s: %w", method, key, err)
	}
	return nil
}

func (f *faultyStore) Put(ctx context.Context, key string, r io.Reader) error {
	if err := f.fault(ctx, "Put", key); err != nil {
		return err
	}
	return f.ObjectStore.Put(ctx, key, r)
}

func (f *faultyStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := f.fault(ctx, "Get", key); err != nil {
		return nil, err
	}
	return f.ObjectStore.Get(ctx, key)
}

// TestStorageFaultKeepsTheState: a suspend whose capture ended the
// workload but could not be stored (snapshot storage refuses
// connections) answers Unavailable, which the control plane repeats with
// the same operation id, and keeps the capture as an agent killed at
// that point would; once storage is back, the repeat stores it. A
// restore whose download meets storage answering 503 SlowDown answers
// Unavailable too, leaving the worker free, and its repeat restores:
// the count goes on throughout.
func TestStorageFaultKeepsTheState(t *testing.T) {
	store := &faultyStore{}
	n := newGVisorNode(t, 1, func(c *Config) { store.ObjectStore, c.Snapshots = c.Snapshots, store })
	ctx := context.Background()
	actor := workload("actor-s", "s", counterTemplate(runtimetest.CounterImage(t)))
	run, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("actor-s", "op-run", n.worker(0)), Workload: actor}))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		if got, want := get(t, run.Msg.GetWorkerIp()), fmt.Sprintf("count=%d lines=%d", i, i); got != want {
			t.Fatalf("request %d: %q, want %q", i, got, want)
		}
	}

	store.fail("Put", &url.Error{Op: "Put", URL: "http://127.0.0.1:9000/snapshots/e2e", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}})
	req := suspendRequest(n.name, "actor-s", "op-suspend", 0)
	// The second attempt goes on from the kept capture and meets the
	// fault again.
	for attempt := 1; attempt <= 2; attempt++ {
		_, err := n.client.Checkpoint(ctx, connect.NewRequest(req))
		wantCode(t, err, connect.CodeUnavailable)
		var rec slotRecord
		if err := readJSON(filepath.Join(n.stateDir, "slots", n.worker(0)+".json"), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.ActorUID != "actor-s" || rec.Capture != "op-suspend" {
			t.Fatalf("attempt %d: slot record holds actor %q, capture %q; want actor-s's capture op-suspend kept", attempt, rec.ActorUID, rec.Capture)
		}
		for _, kept := range []string{
			filepath.Join(n.stateDir, "work", "actor-s", "op-suspend", memoryDir),
			filepath.Join(n.stateDir, "volumes", "actor-s", "data", "requests.log"),
		} {
			if _, err := os.Stat(kept); err != nil {
				t.Fatalf("attempt %d: %v; want it kept for the repeat", attempt, err)
			}
		}
	}
	store.fail("Put", nil)
	resp, err := n.client.Checkpoint(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatalf("checkpoint repeated once storage is back: %v", err)
	}
	n.wantFree(t, 0)
	if entries, err := os.ReadDir(filepath.Join(n.stateDir, "work")); err != nil || len(entries) > 0 {
		t.Errorf("checkpoint stage left behind: %v %v", entries, err)
	}

	snap := &torporv1.SnapshotSource{Location: req.GetLocation(), ManifestDigest: resp.Msg.GetManifestDigest()}
	store.fail("Get", minio.ErrorResponse{StatusCode: http.StatusServiceUnavailable, Code: "SlowDown", Message: "Please reduce your request rate."})
	_, err = n.restore(t, actor, "op-resume", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, snap, nil)
	wantCode(t, err, connect.CodeUnavailable)
	n.wantFree(t, 1)
	store.fail("Get", nil)
	restored, err := n.restore(t, actor, "op-resume", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, snap, nil)
	if err != nil {
		t.Fatalf("restore repeated once storage is back: %v", err)
	}
	if got := get(t, restored.GetWorkerIp()); got != "count=3 lines=3" {
		t.Fatalf("after the restore: %q, want count=3 lines=3", got)
	}

	if _, err := n.client.Terminate(ctx, connect.NewRequest(&torporv1.TerminateRequest{Op: op("actor-s", "op-term", n.worker(1))})); err != nil {
		t.Fatal(err)
	}
	n.wantNoWorkloads(t)
}

// TestDefiniteStorageFailureIsRecorded: a suspend whose capture storage
// refuses for good (access denied) fails definitely: the outcome is
// recorded and answered again to the repeat, and nothing of the actor is
// kept on the node.
func TestDefiniteStorageFailureIsRecorded(t *testing.T) {
	store := &faultyStore{}
	n := newFakeNode(t, func(c *Config) { store.ObjectStore, c.Snapshots = c.Snapshots, store })
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	store.fail("Put", minio.ErrorResponse{StatusCode: http.StatusForbidden, Code: "AccessDenied", Message: "Access Denied."})
	req := &torporv1.CheckpointRequest{
		Op: op("a1", "op-suspend", n.worker(0)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: "s/a1/op-suspend",
	}
	_, err := n.client.Checkpoint(ctx, connect.NewRequest(req))
	wantCode(t, err, connect.CodeInternal)
	store.fail("Put", nil)
	_, again := n.client.Checkpoint(ctx, connect.NewRequest(req))
	if again == nil || again.Error() != err.Error() {
		t.Fatalf("repeat answered %v, want the recorded %v", again, err)
	}
	if st := n.stats(t, 0); st.GetRunning() || st.GetActorUid() != "" {
		t.Fatalf("stats %v after a failed suspend whose workload ended, want free", st)
	}
	for _, dir := range []string{"work", "volumes"} {
		if entries, err := os.ReadDir(filepath.Join(n.cfg.StateDir, dir)); err != nil || len(entries) > 0 {
			t.Errorf("%s left: %v %v", dir, entries, err)
		}
	}
}

// TestStoreNotAnsweringKeepsTheCapture: storage that takes the upload of
// a suspend's capture (or a restore's download) and does not answer
// until the operation's deadline passes is a fault that passes too: the
// capture is kept, the operation answers Unavailable, and its repeat
// (with a deadline of its own) finishes once storage answers.
func TestStoreNotAnsweringKeepsTheCapture(t *testing.T) {
	store := &faultyStore{}
	n := newFakeNode(t, func(c *Config) {
		store.ObjectStore, c.Snapshots = c.Snapshots, store
		c.OperationTimeout = 2 * time.Second
		c.CacheBytes = 1 // a restore downloads
	})
	ctx := context.Background()
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	n.touch(t, 0, 2)
	store.fail("Put", errNoAnswer)
	req := &torporv1.CheckpointRequest{
		Op: op("a1", "op-suspend", n.worker(0)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: "s/a1/op-suspend",
	}
	_, err := n.client.Checkpoint(ctx, connect.NewRequest(req))
	wantCode(t, err, connect.CodeUnavailable)
	var rec slotRecord
	if err := readJSON(filepath.Join(n.cfg.StateDir, "slots", n.worker(0)+".json"), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.ActorUID != "a1" || rec.Capture != "op-suspend" {
		t.Fatalf("slot record holds actor %q, capture %q; want a1's capture op-suspend kept", rec.ActorUID, rec.Capture)
	}
	store.fail("Put", nil)
	resp, err := n.client.Checkpoint(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatalf("checkpoint repeated once storage answers: %v", err)
	}

	snap := &torporv1.SnapshotSource{Location: req.GetLocation(), ManifestDigest: resp.Msg.GetManifestDigest()}
	restore := &torporv1.RestoreRequest{Op: op("a1", "op-resume", n.worker(1)), Workload: n.workload("a1"), Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL, Snapshot: snap}
	store.fail("Get", errNoAnswer)
	_, err = n.client.Restore(ctx, connect.NewRequest(restore))
	wantCode(t, err, connect.CodeUnavailable)
	if st := n.stats(t, 1); st.GetRunning() || st.GetActorUid() != "" {
		t.Fatalf("stats %v after a restore storage did not answer, want the worker free", st)
	}
	store.fail("Get", nil)
	if _, err := n.client.Restore(ctx, connect.NewRequest(restore)); err != nil {
		t.Fatalf("restore repeated once storage answers: %v", err)
	}
	if lines := n.touchLines(t, "a1"); lines != 2 {
		t.Fatalf("restored volume has %d lines, want 2", lines)
	}
}
