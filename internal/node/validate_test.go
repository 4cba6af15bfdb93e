package node

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
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
