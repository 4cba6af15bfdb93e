package store_test

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

// testReads: reads of several kinds in one Reads give what Get and ListAll
// give, outside a transaction and inside one (seeing its own writes).
func testReads(t *testing.T, b backend) {
	ctx := testContext(t)
	s := openStore(t, ctx, b.freshURL(t))
	a, err := s.Actors().Create(ctx, newActor("default", "a"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*torporv1.Worker{
		newWorker("workers", "w1", "node-1", "default"),
		newWorker("workers", "w2", "node-2", "default"),
		newWorker("other", "w3", "node-1", "default"),
	} {
		if _, err := s.Workers().Create(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Nodes().Create(ctx, &torporv1.Node{Metadata: meta("", "node-1")}); err != nil {
		t.Fatal(err)
	}

	rs := &store.Reads{}
	actor := store.ReadGet(rs, s.Actors(), "default", "a")
	missing := store.ReadGet(rs, s.Snapshots(), "default", "nope")
	onNode1 := store.ReadAll(rs, s.Workers(), store.ListOptions{Space: "workers", Filter: store.Filter{"node": "node-1"}})
	free := store.ReadAll(rs, s.Workers(), store.ListOptions{Filter: store.Filter{"actor": ""}})
	nodes := store.ReadAll(rs, s.Nodes(), store.ListOptions{})
	bad := store.ReadAll(rs, s.Workers(), store.ListOptions{Filter: store.Filter{"color": "red"}})
	if err := rs.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := actor.Record(); err != nil || !proto.Equal(got, a) {
		t.Errorf("actor: %v, %v; want %v", got, err, a)
	}
	if _, err := missing.Record(); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing snapshot: %v, want ErrNotFound", err)
	}
	if _, err := bad.Records(); !errors.Is(err, store.ErrInvalidArgument) {
		t.Errorf("unknown filter field: %v, want ErrInvalidArgument", err)
	}
	names := func(r *store.Read[*torporv1.Worker]) []string {
		ws, err := r.Records()
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, w := range ws {
			n = append(n, w.GetMetadata().GetSpace()+"/"+w.GetMetadata().GetName())
		}
		return n
	}
	if got := names(onNode1); len(got) != 1 || got[0] != "workers/w1" {
		t.Errorf("workers of node-1 in space workers: %v, want [workers/w1]", got)
	}
	if got := names(free); len(got) != 3 || got[0] != "other/w3" || got[2] != "workers/w2" {
		t.Errorf("free workers: %v, want all three in key order", got)
	}
	if ns, err := nodes.Records(); err != nil || len(ns) != 1 {
		t.Errorf("nodes: %v, %v; want node-1", ns, err)
	}

	// In a transaction the reads see its writes.
	err = s.InTx(ctx, func(tx store.Tx) error {
		w, err := tx.Workers().Get(ctx, "workers", "w1")
		if err != nil {
			return err
		}
		if err := claim(ctx, tx, a, w); err != nil {
			return err
		}
		rs := &store.Reads{}
		free := store.ReadAll(rs, tx.Workers(), store.ListOptions{Filter: store.Filter{"actor": ""}})
		actor := store.ReadGet(rs, tx.Actors(), "default", "a")
		if err := rs.Run(ctx); err != nil {
			return err
		}
		if got := names(free); len(got) != 2 {
			t.Errorf("free workers after a claim in the transaction: %v, want 2", got)
		}
		if got, err := actor.Record(); err != nil || got.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_RESUMING {
			t.Errorf("actor in the transaction: %v, %v; want RESUMING", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
