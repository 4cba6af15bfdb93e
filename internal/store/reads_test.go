package store_test

import (
	"errors"
	"strings"
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

// testReadsIn: a read selecting by another record's values (ReadAllIn)
// finds what reading that record first and then filtering by its values
// finds, in the same statement; an absent record selects nothing.
func testReadsIn(t *testing.T, b backend) {
	ctx := testContext(t)
	s := openStore(t, ctx, b.freshURL(t))
	a, err := s.Actors().Create(ctx, newActor("default", "a"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Actors().Create(ctx, newActor("default", "b"))
	if err != nil {
		t.Fatal(err)
	}
	for _, snap := range []*torporv1.Snapshot{
		{Metadata: meta("default", "s1"), ActorUid: a.GetMetadata().GetUid(), Location: "loc-1"},
		{Metadata: meta("default", "s2"), ActorUid: a.GetMetadata().GetUid(), Location: "loc-2"},
		{Metadata: meta("default", "s3"), ActorUid: other.GetMetadata().GetUid(), Location: "loc-3"},
		// A fork of s2 in another space shares its files.
		{Metadata: meta("forks", "f1"), ActorUid: "fork-uid", Location: "loc-2"},
	} {
		if _, err := s.Snapshots().Create(ctx, snap); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Tags().Create(ctx, &torporv1.SnapshotTag{Metadata: meta("default", "keep"), Snapshot: "s1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Tags().Create(ctx, &torporv1.SnapshotTag{Metadata: meta("default", "keep-other"), Snapshot: "s3"}); err != nil {
		t.Fatal(err)
	}

	rs := &store.Reads{}
	ofA := store.ListOptions{Space: "default", Filter: store.Filter{"actor_uid": a.GetMetadata().GetUid()}}
	byUID := store.ReadAllIn(rs, s.Snapshots(), store.ListOptions{Space: "default"}, "actor_uid", store.ValuesOf(s.Actors(), "uid", "default", "a"))
	ofMissing := store.ReadAllIn(rs, s.Snapshots(), store.ListOptions{}, "actor_uid", store.ValuesOf(s.Actors(), "uid", "default", "nobody"))
	sharing := store.ReadAllIn(rs, s.Snapshots(), store.ListOptions{}, "location", store.ValuesIn(s.Snapshots(), "location", ofA))
	tags := store.ReadAllIn(rs, s.Tags(), store.ListOptions{Space: "default"}, "snapshot", store.ValuesIn(s.Snapshots(), "name", ofA))
	bad := store.ReadAllIn(rs, s.Snapshots(), store.ListOptions{}, "color", store.ValuesIn(s.Snapshots(), "name", ofA))
	badValues := store.ReadAllIn(rs, s.Snapshots(), store.ListOptions{}, "name", store.ValuesIn(s.Snapshots(), "color", ofA))
	if err := rs.Run(ctx); err != nil {
		t.Fatal(err)
	}
	keys := func(recs []*torporv1.Snapshot, err error) string {
		if err != nil {
			t.Fatal(err)
		}
		var k []string
		for _, r := range recs {
			k = append(k, r.GetMetadata().GetSpace()+"/"+r.GetMetadata().GetName())
		}
		return strings.Join(k, " ")
	}
	if got := keys(byUID.Records()); got != "default/s1 default/s2" {
		t.Errorf("snapshots of actor a by its uid: %q, want default/s1 default/s2", got)
	}
	if got := keys(ofMissing.Records()); got != "" {
		t.Errorf("snapshots of an absent actor: %q, want none", got)
	}
	if got := keys(sharing.Records()); got != "default/s1 default/s2 forks/f1" {
		t.Errorf("snapshots sharing a location with a's: %q, want default/s1 default/s2 forks/f1", got)
	}
	if ts, err := tags.Records(); err != nil || len(ts) != 1 || ts[0].GetMetadata().GetName() != "keep" {
		t.Errorf("tags of a's snapshots: %v, %v; want keep", ts, err)
	}
	if _, err := bad.Records(); !errors.Is(err, store.ErrInvalidArgument) {
		t.Errorf("unknown field: %v, want ErrInvalidArgument", err)
	}
	if _, err := badValues.Records(); !errors.Is(err, store.ErrInvalidArgument) {
		t.Errorf("values of an unknown field: %v, want ErrInvalidArgument", err)
	}
}
