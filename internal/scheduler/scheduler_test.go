package scheduler

import (
	"errors"
	"slices"
	"strings"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func worker(name, node, class, pool string, labels map[string]string) *torporv1.Worker {
	return &torporv1.Worker{
		Metadata: &torporv1.ObjectMeta{Name: name, Space: "torpor-system", Labels: labels},
		Spec:     &torporv1.WorkerSpec{Node: node, SandboxClass: class, Pool: pool},
	}
}

func claiming(names ...string) func(*torporv1.Worker) bool {
	return func(w *torporv1.Worker) bool { return slices.Contains(names, w.GetMetadata().GetName()) }
}

func TestPick(t *testing.T) {
	workers := []*torporv1.Worker{
		worker("w-b", "n1", "gvisor", "default", map[string]string{"tier": "gold"}),
		worker("w-a", "n1", "gvisor", "default", nil),
		worker("w-c", "n2", "gvisor", "big", map[string]string{"tier": "gold"}),
		worker("w-d", "dead", "gvisor", "default", nil),
	}
	// w-b is kept warm for actor uid-1, w-d (on a dead node) for uid-2,
	// w-c for template t-2's next actor.
	workers[0].Status = &torporv1.WorkerStatus{WarmActorUid: "uid-1"}
	workers[3].Status = &torporv1.WorkerStatus{WarmActorUid: "uid-2"}
	workers[2].Status = &torporv1.WorkerStatus{WarmTemplateUid: "t-2"}
	live := func(n string) bool { return n != "dead" }
	tests := []struct {
		name    string
		free    []*torporv1.Worker
		req     Request
		want    string
		wantErr string
	}{
		{"stable first by name", workers, Request{SandboxClass: "gvisor"}, "w-a", ""},
		// w-b is warm for another actor, whose sandbox is kept.
		{"selector", workers, Request{SandboxClass: "gvisor", Selector: map[string]string{"tier": "gold"}}, "w-c", ""},
		{"pool is matched by selector", workers, Request{SandboxClass: "gvisor", Selector: map[string]string{"pool": "big"}}, "w-c", ""},
		{"required node", workers, Request{SandboxClass: "gvisor", RequireNode: "n2"}, "w-c", ""},
		{"cache locality preferred", workers, Request{SandboxClass: "gvisor", CachedOn: []string{"n2"}}, "w-c", ""},
		{"a worker being claimed is picked last", workers, Request{SandboxClass: "gvisor", Claiming: claiming("w-a")}, "w-c", ""},
		{"a worker warm for another actor is picked last", workers, Request{SandboxClass: "gvisor", Claiming: claiming("w-a", "w-c")}, "w-b", ""},
		{"before cache locality", workers, Request{SandboxClass: "gvisor", CachedOn: []string{"n2"}, Claiming: claiming("w-c")}, "w-a", ""},
		{"but still picked when nothing else fits", workers, Request{SandboxClass: "gvisor", RequireNode: "n2", Claiming: claiming("w-c")}, "w-c", ""},
		{"by name among the claimed", workers, Request{SandboxClass: "gvisor", Claiming: claiming("w-a", "w-b", "w-c")}, "w-a", ""},
		{"the worker kept warm for the actor", workers, Request{SandboxClass: "gvisor", WarmFor: "uid-1"}, "w-b", ""},
		{"warm before cache locality", workers, Request{SandboxClass: "gvisor", WarmFor: "uid-1", CachedOn: []string{"n2"}}, "w-b", ""},
		{"warm for another actor counts for nothing", workers, Request{SandboxClass: "gvisor", WarmFor: "uid-3"}, "w-a", ""},
		{"warm but being claimed", workers, Request{SandboxClass: "gvisor", WarmFor: "uid-1", Claiming: claiming("w-b")}, "w-a", ""},
		{"warm on a dead node never chosen", workers, Request{SandboxClass: "gvisor", WarmFor: "uid-2"}, "w-a", ""},
		{"a worker warm for the template", workers, Request{SandboxClass: "gvisor", WarmFor: "uid-5", WarmTemplate: "t-2"}, "w-c", ""},
		{"the actor's own warm worker before the template's", workers, Request{SandboxClass: "gvisor", WarmFor: "uid-1", WarmTemplate: "t-2"}, "w-b", ""},
		{"cache locality before the template's warm worker", workers, Request{SandboxClass: "gvisor", WarmTemplate: "t-2", CachedOn: []string{"n1"}}, "w-a", ""},
		{"warm for another template counts for nothing", workers, Request{SandboxClass: "gvisor", WarmTemplate: "t-3"}, "w-a", ""},
		{"dead node never chosen", workers[3:], Request{SandboxClass: "gvisor"}, "", "live node"},
		{"class", workers, Request{SandboxClass: "microvm"}, "", `sandbox class "microvm"`},
		{"selector fails", workers, Request{SandboxClass: "gvisor", Selector: map[string]string{"tier": "silver"}}, "", "selector tier=silver"},
		{"required node full", workers, Request{SandboxClass: "gvisor", RequireNode: "n3"}, "", `node "n3"`},
		{"nothing free", nil, Request{SandboxClass: "gvisor"}, "", "every worker is busy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Pick(tt.free, live, tt.req)
			if tt.wantErr != "" {
				var nw *NoWorkerError
				if !errors.As(err, &nw) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want NoWorkerError mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.GetMetadata().GetName() != tt.want {
				t.Fatalf("picked %s, want %s", got.GetMetadata().GetName(), tt.want)
			}
		})
	}
}
