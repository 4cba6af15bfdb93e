package store

import (
	"context"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// TestUpdateKeepsKnownColumns: an update leaves out the indexed columns
// it believes unchanged, and a wrong belief never leaves a column stale.
func TestUpdateKeepsKnownColumns(t *testing.T) {
	for _, backend := range storetest.Backends {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			st, err := Open(ctx, storetest.URL(t, backend))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			s := st.(*sqlStore)
			w, err := s.Workers().Create(ctx, &torporv1.Worker{
				Metadata: &torporv1.ObjectMeta{Space: "ns", Name: "w"},
				Spec:     &torporv1.WorkerSpec{Node: "n1", Pool: "p"},
				Status:   &torporv1.WorkerStatus{},
			})
			if err != nil {
				t.Fatal(err)
			}
			on := func(field, value string) bool {
				t.Helper()
				ws, _, err := s.Workers().List(ctx, ListOptions{Filter: Filter{field: value}})
				if err != nil {
					t.Fatal(err)
				}
				return len(ws) == 1 && ws[0].GetMetadata().GetVersion() == w.GetMetadata().GetVersion()
			}

			// Known and unchanged: node and pool stay, actor changes.
			w.Status.Actor = &torporv1.ActorRef{Uid: "a1"}
			if w, err = s.Workers().Update(ctx, w); err != nil {
				t.Fatal(err)
			}
			if !on("node", "n1") || !on("pool", "p") || !on("actor", "a1") {
				t.Fatal("columns after an update that kept node and pool are wrong")
			}

			// A wrong belief: the cache says node is already n2.
			s.columns.put("workers", w.GetMetadata().GetUid(), w.GetMetadata().GetVersion(), []string{"n2", "p", "a1"})
			w.Spec.Node = "n2"
			if w, err = s.Workers().Update(ctx, w); err != nil {
				t.Fatal(err)
			}
			if !on("node", "n2") || on("node", "n1") {
				t.Fatal("an update on a wrong belief left the node column stale")
			}

			// A stale version in the cache is not used, and a conflict is
			// still a conflict.
			stale := w.GetMetadata().GetVersion() - 1
			old := &torporv1.Worker{Metadata: &torporv1.ObjectMeta{Space: "ns", Name: "w", Uid: w.GetMetadata().GetUid(), Version: stale}, Spec: w.GetSpec(), Status: w.GetStatus()}
			if _, err := s.Workers().Update(ctx, old); err == nil {
				t.Fatal("update of a stale version succeeded")
			}
		})
	}
}
