package node

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/runtime/fake"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/validate"
)

// The templates' rules keep volumes off the identity the node mounts.
func TestIdentityIsReserved(t *testing.T) {
	if !strings.HasPrefix(IdentityMountPath, validate.ReservedPath+"/") {
		t.Fatalf("IdentityMountPath %s is not below validate.ReservedPath %s: templates could mount over it", IdentityMountPath, validate.ReservedPath)
	}
}

// A node called directly (not through the control plane's apply) refuses
// what apply refuses, and reads no image its own policy does not allow.
func TestNodeRefusesWhatApplyRefuses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	// Even a node allowing any registry reaches no loopback address by it.
	images, err := image.NewPolicy(image.PolicyConfig{Registries: []string{"*"}, Dirs: runtimetest.ImageDirs(t)})
	if err != nil {
		t.Fatal(err)
	}
	n := newFakeNode(t, func(c *Config) { c.Images = images })
	digest := "@sha256:" + strings.Repeat("ab", 32)
	env := make([]*torporv1.EnvVar, 25_000)
	for i := range env {
		env[i] = &torporv1.EnvVar{Name: fmt.Sprintf("BOMB_%d", i), Value: strings.Repeat("x", 150)}
	}
	tests := []struct {
		name   string
		change func(*torporv1.TemplateSpec)
		field  string
		reason string
	}{
		{"loopback registry", func(s *torporv1.TemplateSpec) { s.Containers[0].Image = ln.Addr().String() + "/probe/x" + digest },
			"workload.template.containers[0].image", "is a loopback address"},
		{"host file", func(s *torporv1.TemplateSpec) { s.Containers[0].Image = "oci:/etc/shadow" + digest },
			"workload.template.containers[0].image", "outside the allowed image directories"},
		{"env bomb", func(s *torporv1.TemplateSpec) { s.Containers[0].Env = env },
			"workload.template.containers[0].env", "25000 variables"},
		{"env name with =", func(s *torporv1.TemplateSpec) { s.Containers[0].Env = []*torporv1.EnvVar{{Name: "A=B"}} },
			"workload.template.containers[0].env[0].name", "no '='"},
		{"identity-shadowing mount", func(s *torporv1.TemplateSpec) { s.Containers[0].Mounts[0].Path = IdentityMountPath },
			"workload.template.containers[0].mounts[0].path", "would hide"},
		{"onCommit out of range", func(s *torporv1.TemplateSpec) { s.SnapshotPolicy = &torporv1.SnapshotPolicy{OnCommit: 99} },
			"workload.template.snapshotPolicy.onCommit", "want FULL or DATA"},
	}
	ctx := context.Background()
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := n.workload("a1")
			w.Template = proto.Clone(w.Template).(*torporv1.TemplateSpec)
			tc.change(w.Template)
			_, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("a1", fmt.Sprintf("op-%d", i), n.worker(0)), Workload: w}))
			wantCode(t, err, connect.CodeInvalidArgument)
			if !strings.Contains(err.Error(), tc.field+": ") || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("Run = %v, want it to name %s and say %q", err, tc.field, tc.reason)
			}
		})
	}
	if got := accepted.Load(); got != 0 {
		t.Fatalf("the loopback listener accepted %d connections, want none", got)
	}
	// (A refusal while the worker is staged cleans it up: Terminate.)
	for _, c := range n.rt.Calls() {
		if c.Method == "Run" || c.Method == "Restore" || c.Method == "Warm" || c.Method == "Exec" {
			t.Fatalf("a refused workload reached the runtime: %v", n.rt.Calls())
		}
	}
	// Nothing was left behind on the worker.
	if _, err := n.run(ctx, "a1", "op-good", 0); err != nil {
		t.Fatalf("Run of a good workload after the refusals: %v", err)
	}
}

func TestBadRequests(t *testing.T) {
	n := newFakeNode(t)
	ctx := context.Background()
	good := func() *torporv1.RunRequest {
		return &torporv1.RunRequest{Op: op("a1", "op-1", n.worker(0)), Workload: n.workload("a1")}
	}
	tests := []struct {
		name   string
		change func(*torporv1.RunRequest)
		code   connect.Code
		field  string
	}{
		{"no op", func(r *torporv1.RunRequest) { r.Op = nil }, connect.CodeInvalidArgument, "op"},
		{"no actor uid", func(r *torporv1.RunRequest) { r.Op.ActorUid = "" }, connect.CodeInvalidArgument, "op.actorUid"},
		{"path in operation id", func(r *torporv1.RunRequest) { r.Op.OperationId = "../../etc" }, connect.CodeInvalidArgument, "op.operationId"},
		{"no worker", func(r *torporv1.RunRequest) { r.Op.Worker = "" }, connect.CodeInvalidArgument, "op.worker"},
		{"unknown worker", func(r *torporv1.RunRequest) { r.Op.Worker = "n1-w9" }, connect.CodeNotFound, "worker n1-w9 is not on node n1"},
		{"other actor's workload", func(r *torporv1.RunRequest) { r.Workload.ActorUid = "a2" }, connect.CodeInvalidArgument, "workload.actorUid"},
		{"no containers", func(r *torporv1.RunRequest) { r.Workload.Template = &torporv1.TemplateSpec{} }, connect.CodeInvalidArgument, "workload.template.containers"},
		{"unpinned image", func(r *torporv1.RunRequest) {
			r.Workload.Template = appTemplate(t)
			r.Workload.Template.Containers[0].Image = "oci:/somewhere:latest"
		}, connect.CodeInvalidArgument, "workload.template.containers[0].image"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := good()
			tt.change(req)
			_, err := n.client.Run(ctx, connect.NewRequest(req))
			wantCode(t, err, tt.code)
			if !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("error %v does not name %s", err, tt.field)
			}
		})
	}
	restoreTests := []struct {
		name  string
		req   *torporv1.RestoreRequest
		field string
	}{
		{"BOOT", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_BOOT}, "scope"},
		{"FULL without snapshot", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_FULL}, "snapshot"},
		{"DATA_ON_GOLDEN without golden", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN}, "golden"},
		{"bad location", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA, Snapshot: &torporv1.SnapshotSource{Location: "../x", ManifestDigest: "sha256:00"}}, "snapshot.location"},
		{"no digest", &torporv1.RestoreRequest{Scope: torporv1.RestoreScope_RESTORE_SCOPE_DATA, Snapshot: &torporv1.SnapshotSource{Location: "s/a1/x"}}, "snapshot.manifestDigest"},
	}
	for _, tt := range restoreTests {
		t.Run("restore "+tt.name, func(t *testing.T) {
			tt.req.Op, tt.req.Workload = op("a1", "op-r", n.worker(0)), n.workload("a1")
			_, err := n.client.Restore(ctx, connect.NewRequest(tt.req))
			wantCode(t, err, connect.CodeInvalidArgument)
			if !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("error %v does not name %s", err, tt.field)
			}
		})
	}
	checkpointTests := []struct {
		name  string
		req   *torporv1.CheckpointRequest
		field string
	}{
		{"no scope", &torporv1.CheckpointRequest{Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: "s/a1/x"}, "scope"},
		{"no target", &torporv1.CheckpointRequest{Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Location: "s/a1/x"}, "target"},
		{"bad location", &torporv1.CheckpointRequest{Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: "s/a1"}, "location"},
	}
	for _, tt := range checkpointTests {
		t.Run("checkpoint "+tt.name, func(t *testing.T) {
			tt.req.Op = op("a1", "op-c", n.worker(0))
			_, err := n.client.Checkpoint(ctx, connect.NewRequest(tt.req))
			wantCode(t, err, connect.CodeInvalidArgument)
			if !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("error %v does not name %s", err, tt.field)
			}
		})
	}
	if c := len(n.rt.Calls()); slices.ContainsFunc(n.rt.Calls(), func(c fake.Call) bool { return c.Method != "Sandboxes" && c.Method != "Stats" }) {
		t.Fatalf("bad requests reached the runtime (%d calls): %v", c, n.rt.Calls())
	}
}
