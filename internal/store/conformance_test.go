package store_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// TestConformance runs one suite against every backend: they must behave
// identically.
func TestConformance(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, b backend)
	}{
		{"default space exists", testDefaultSpace},
		{"every kind round-trips", testEveryKind},
		{"create keeps a given uid", testCreateKeepsUID},
		{"already exists", testAlreadyExists},
		{"sandbox IDs are unique across spaces", testSandboxIDsUnique},
		{"not found", testNotFound},
		{"invalid records", testInvalidRecords},
		{"update is compare-and-set", testUpdateCAS},
		{"delete preconditions", testDeletePreconditions},
		{"list pages in key order", testListPaging},
		{"list page sizes", testListPageSizes},
		{"list filters", testListFilters},
		{"list rejects bad input", testListBadInput},
		{"reads of several kinds at once", testReads},
		{"reads selecting by other records' values", testReadsIn},
		{"transaction commits together", testTxCommit},
		{"transaction rolls back on error", testTxRollbackOnError},
		{"transaction rolls back on panic", testTxRollbackOnPanic},
		{"stale write rolls back its transaction", testTxStaleWrite},
		{"concurrent claims of one worker: one wins", testConcurrentClaim},
		{"events", testEvents},
		{"reopen keeps records", testReopen},
		{"concurrent opens migrate once", testConcurrentOpen},
		{"secrets", testSecrets},
		{"list secrets", testListSecrets},
		{"concurrent secrets across replicas", testConcurrentSecrets},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) { tc.run(t, b) })
			}
		})
	}
}

func fresh(t *testing.T, b backend) (context.Context, store.Store) {
	ctx := testContext(t)
	return ctx, openStore(t, ctx, b.freshURL(t))
}

func mustCreate[T store.Object](t *testing.T, ctx context.Context, c store.Collection[T], obj T) T {
	t.Helper()
	created, err := c.Create(ctx, obj)
	if err != nil {
		t.Fatalf("create %s: %v", obj.GetMetadata().GetName(), err)
	}
	return created
}

func mustGet[T store.Object](t *testing.T, ctx context.Context, c store.Collection[T], space, name string) T {
	t.Helper()
	got, err := c.Get(ctx, space, name)
	if err != nil {
		t.Fatalf("get %s/%s: %v", space, name, err)
	}
	return got
}

func wantErr(t *testing.T, err, target error, mentions ...string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error = %v, want %v", err, target)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("error %q does not mention %q", err, m)
		}
	}
}

func wantEqual(t *testing.T, what string, got, want proto.Message) {
	t.Helper()
	if !proto.Equal(got, want) {
		t.Fatalf("%s:\n got  %v\n want %v", what, got, want)
	}
}

func testDefaultSpace(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	sp := mustGet(t, ctx, s.Spaces(), "", store.DefaultSpace)
	if sp.GetMetadata().GetVersion() != 1 || sp.GetMetadata().GetUid() == "" {
		t.Errorf("default space metadata = %v, want version 1 and a uid", sp.GetMetadata())
	}
	spaces, next, err := s.Spaces().List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(spaces) != 1 || next != "" {
		t.Fatalf("spaces = %v (next %q), want only the default space", spaces, next)
	}
}

// testEveryKind drives create, get, update and delete through each
// collection.
func testEveryKind(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	cases := []struct {
		kind string
		run  func(t *testing.T)
	}{
		{"space", func(t *testing.T) {
			roundTrip(t, ctx, s.Spaces(), &torporv1.Space{Metadata: meta("", "team-a")})
		}},
		{"template", func(t *testing.T) {
			roundTrip(t, ctx, s.Templates(), &torporv1.Template{
				Metadata: meta("default", "python"),
				Spec: &torporv1.TemplateSpec{
					SandboxClass: "gvisor",
					Containers:   []*torporv1.Container{{Name: "main", Image: "example@sha256:00", Env: []*torporv1.EnvVar{{Name: "A", Value: "1"}}}},
					Volumes:      []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
				},
				Status: &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING},
			})
		}},
		{"actor", func(t *testing.T) {
			roundTrip(t, ctx, s.Actors(), newActor("default", "web"))
		}},
		{"worker", func(t *testing.T) {
			roundTrip(t, ctx, s.Workers(), newWorker("torpor", "slot-0", "node-1", "default"))
		}},
		{"snapshot", func(t *testing.T) {
			roundTrip(t, ctx, s.Snapshots(), &torporv1.Snapshot{
				Metadata: meta("default", "snap-1"), ActorUid: "a-uid", Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
				TemplateUid: "t-uid", Location: "file:///snapshots/x", SizeBytes: 1 << 20, Node: "node-1", HasData: true,
			})
		}},
		{"snapshot tag", func(t *testing.T) {
			roundTrip(t, ctx, s.Tags(), &torporv1.SnapshotTag{
				Metadata: meta("default", "prepared"), Snapshot: "snap-1", Actor: "web", Scope: torporv1.SnapshotTagScope_SNAPSHOT_TAG_SCOPE_PUBLISHED,
			})
		}},
		{"node", func(t *testing.T) {
			roundTrip(t, ctx, s.Nodes(), &torporv1.Node{
				Metadata: meta("", "node-1"), Address: "10.0.0.1:7443", SandboxClasses: []string{"gvisor"},
				HeartbeatTime: timestamppb.New(time.Unix(1700000000, 123456789)),
			})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.kind, tc.run)
	}
}

func roundTrip[T store.Object](t *testing.T, ctx context.Context, c store.Collection[T], obj T) {
	t.Helper()
	input := proto.CloneOf(obj)
	before := time.Now()
	created := mustCreate(t, ctx, c, obj)
	wantEqual(t, "caller's record after create", obj, input)

	m := created.GetMetadata()
	if _, err := uuid.Parse(m.GetUid()); err != nil {
		t.Errorf("uid %q is not a UUID: %v", m.GetUid(), err)
	}
	if m.GetVersion() != 1 {
		t.Errorf("version = %d, want 1", m.GetVersion())
	}
	ct := m.GetCreateTime().AsTime()
	if !proto.Equal(m.GetCreateTime(), m.GetUpdateTime()) || ct.Before(before.Add(-time.Second)) || ct.After(time.Now().Add(time.Second)) {
		t.Errorf("create/update time = %v/%v, want both now", ct, m.GetUpdateTime().AsTime())
	}
	if ct.Nanosecond()%1000 != 0 {
		t.Errorf("create time %v is finer than microseconds: it would not survive both databases", ct)
	}
	// Apart from the store's metadata, the record is what was given.
	want := proto.CloneOf(input)
	want.GetMetadata().Uid, want.GetMetadata().Version = m.GetUid(), 1
	want.GetMetadata().CreateTime, want.GetMetadata().UpdateTime = m.GetCreateTime(), m.GetUpdateTime()
	wantEqual(t, "created record", created, want)

	space, name := m.GetSpace(), m.GetName()
	wantEqual(t, "stored record", mustGet(t, ctx, c, space, name), created)

	changed := proto.CloneOf(created)
	changed.GetMetadata().Labels = map[string]string{"tier": "gold"}
	updated, err := c.Update(ctx, changed)
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	um := updated.GetMetadata()
	if um.GetVersion() != 2 || um.GetLabels()["tier"] != "gold" || !proto.Equal(um.GetCreateTime(), m.GetCreateTime()) ||
		um.GetUpdateTime().AsTime().Before(ct) {
		t.Errorf("updated metadata = %v, want version 2, the label, the old create time, a later update time", um)
	}
	wantEqual(t, "stored record after update", mustGet(t, ctx, c, space, name), updated)

	if err := c.Delete(ctx, space, name, um.GetUid(), um.GetVersion()); err != nil {
		t.Fatalf("delete: %v", err)
	}
	_, err = c.Get(ctx, space, name)
	wantErr(t, err, store.ErrNotFound)
}

func testCreateKeepsUID(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	a := newActor("default", "web")
	a.Metadata.Uid = "0b6f6e29-5e53-4c0f-9f4e-6d1f6a0c1a11"
	a.Metadata.Version = 42
	created := mustCreate(t, ctx, s.Actors(), a)
	if created.GetMetadata().GetUid() != a.Metadata.Uid || created.GetMetadata().GetVersion() != 1 {
		t.Fatalf("metadata = %v, want the given uid and version 1", created.GetMetadata())
	}
}

func testAlreadyExists(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	first := mustCreate(t, ctx, s.Actors(), newActor("default", "web"))

	_, err := s.Actors().Create(ctx, newActor("default", "web"))
	wantErr(t, err, store.ErrAlreadyExists, "actor default/web")

	sameUID := newActor("default", "api")
	sameUID.Metadata.Uid = first.GetMetadata().GetUid()
	_, err = s.Actors().Create(ctx, sameUID)
	wantErr(t, err, store.ErrAlreadyExists, "uid "+first.GetMetadata().GetUid())

	mustCreate(t, ctx, s.Actors(), newActor("other", "web")) // names are per space

	// A refused create leaves the transaction usable (PostgreSQL aborts a
	// transaction on any failed statement).
	err = s.InTx(ctx, func(tx store.Tx) error {
		if _, err := tx.Actors().Create(ctx, newActor("default", "web")); !errors.Is(err, store.ErrAlreadyExists) {
			return fmt.Errorf("duplicate create in transaction: %v, want ErrAlreadyExists", err)
		}
		_, err := tx.Actors().Create(ctx, newActor("default", "after"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	mustGet(t, ctx, s.Actors(), "default", "after")
}

// An E2B sandbox's ID (its actor's name) is unique across spaces, and
// found by the "sandbox" filter without a space; other actors are not in
// that index, whatever their names.
func testSandboxIDsUnique(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	sandbox := func(space, name string) *torporv1.Actor {
		a := newActor(space, name)
		a.Spec.Sandbox = &torporv1.Sandbox{AutoPause: true}
		return a
	}
	mustCreate(t, ctx, s.Actors(), sandbox("default", "sbx1"))
	mustCreate(t, ctx, s.Actors(), newActor("other", "sbx1")) // not a sandbox: no conflict
	_, err := s.Actors().Create(ctx, sandbox("third", "sbx1"))
	wantErr(t, err, store.ErrAlreadyExists, "sandbox ID")
	err = s.InTx(ctx, func(tx store.Tx) error {
		if _, err := tx.Actors().Create(ctx, sandbox("third", "sbx1")); !errors.Is(err, store.ErrAlreadyExists) {
			return fmt.Errorf("duplicate sandbox in a transaction: %v, want ErrAlreadyExists", err)
		}
		_, err := tx.Actors().Create(ctx, sandbox("third", "sbx2"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"sbx1": "default/sbx1", "sbx2": "third/sbx2", "web": ""} {
		found, _, err := s.Actors().List(ctx, store.ListOptions{Filter: store.Filter{"sandbox": id}})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range found {
			got = append(got, a.GetMetadata().GetSpace()+"/"+a.GetMetadata().GetName())
		}
		if strings.Join(got, " ") != want {
			t.Errorf("sandbox %s: found %q, want %q", id, got, want)
		}
	}
}

func testNotFound(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	_, err := s.Actors().Get(ctx, "default", "ghost")
	wantErr(t, err, store.ErrNotFound, "actor default/ghost")

	ghost := newActor("default", "ghost")
	ghost.Metadata.Uid, ghost.Metadata.Version = uuid.NewString(), 1
	_, err = s.Actors().Update(ctx, ghost)
	wantErr(t, err, store.ErrNotFound, "actor default/ghost")

	err = s.Actors().Delete(ctx, "default", "ghost", "", 0)
	wantErr(t, err, store.ErrNotFound, "actor default/ghost")

	_, err = s.Spaces().Get(ctx, "", "nowhere")
	wantErr(t, err, store.ErrNotFound, "space nowhere")
}

func testInvalidRecords(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	cases := []struct {
		name    string
		actor   *torporv1.Actor
		mention string
	}{
		{"nil record", nil, "nil"},
		{"no metadata", &torporv1.Actor{}, "metadata.name"},
		{"no name", &torporv1.Actor{Metadata: meta("default", "")}, "metadata.name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Actors().Create(ctx, tc.actor)
			wantErr(t, err, store.ErrInvalidArgument, "actor", tc.mention)
			_, err = s.Actors().Update(ctx, tc.actor)
			wantErr(t, err, store.ErrInvalidArgument, "actor", tc.mention)
		})
	}
}

func testUpdateCAS(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	v1 := mustCreate(t, ctx, s.Actors(), newActor("default", "web"))
	next := proto.CloneOf(v1)
	next.Status.State = torporv1.ActorState_ACTOR_STATE_RESUMING
	v2, err := s.Actors().Update(ctx, next)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name    string
		change  func(a *torporv1.Actor)
		mention string
	}{
		{"stale version", func(a *torporv1.Actor) { a.Metadata.Version = 1 }, "version 1"},
		{"future version", func(a *torporv1.Actor) { a.Metadata.Version = 3 }, "version 3"},
		{"wrong uid", func(a *torporv1.Actor) { a.Metadata.Uid = uuid.NewString() }, "uid"},
		{"no uid", func(a *torporv1.Actor) { a.Metadata.Uid = "" }, `uid ""`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := proto.CloneOf(v2)
			a.Status.State = torporv1.ActorState_ACTOR_STATE_CRASHED
			tc.change(a)
			_, err := s.Actors().Update(ctx, a)
			wantErr(t, err, store.ErrConflict, "actor default/web", tc.mention)
			wantEqual(t, "stored record after a refused update", mustGet(t, ctx, s.Actors(), "default", "web"), v2)
		})
	}

	t.Run("create time is the store's", func(t *testing.T) {
		a := mustGet(t, ctx, s.Actors(), "default", "web")
		a.Metadata.CreateTime = timestamppb.New(time.Unix(1, 0))
		updated, err := s.Actors().Update(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(updated.GetMetadata().GetCreateTime(), v1.GetMetadata().GetCreateTime()) {
			t.Errorf("create time after update = %v, want %v", updated.GetMetadata().GetCreateTime().AsTime(), v1.GetMetadata().GetCreateTime().AsTime())
		}
		wantEqual(t, "stored record", mustGet(t, ctx, s.Actors(), "default", "web"), updated)
	})
}

func testDeletePreconditions(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	w := mustCreate(t, ctx, s.Workers(), newWorker("torpor", "slot-0", "node-1", "default"))
	uid := w.GetMetadata().GetUid()
	cases := []struct {
		name    string
		uid     string
		version int64
		want    error
	}{
		{"wrong uid", uuid.NewString(), 0, store.ErrConflict},
		{"stale version", "", 2, store.ErrConflict},
		{"right uid, wrong version", uid, 7, store.ErrConflict},
		{"matching uid and version", uid, 1, nil},
		{"already gone", uid, 1, store.ErrNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Workers().Delete(ctx, "torpor", "slot-0", tc.uid, tc.version)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantErr(t, err, tc.want, "worker torpor/slot-0")
		})
	}

	mustCreate(t, ctx, s.Workers(), newWorker("torpor", "slot-1", "node-1", "default"))
	if err := s.Workers().Delete(ctx, "torpor", "slot-1", "", 0); err != nil {
		t.Fatalf("delete without preconditions: %v", err)
	}
}

func keyOf(o store.Object) string {
	return o.GetMetadata().GetSpace() + "/" + o.GetMetadata().GetName()
}

// listAll pages through a list and returns the keys in page order.
func listAll[T store.Object](t *testing.T, ctx context.Context, c store.Collection[T], opts store.ListOptions) []string {
	t.Helper()
	var keys []string
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatal("paging does not end")
		}
		items, next, err := c.List(ctx, opts)
		if err != nil {
			t.Fatalf("list %+v: %v", opts, err)
		}
		if opts.PageSize > 0 && len(items) > opts.PageSize {
			t.Fatalf("page of %d items, page size %d", len(items), opts.PageSize)
		}
		for _, it := range items {
			keys = append(keys, keyOf(it))
		}
		if next == "" {
			return keys
		}
		if len(items) == 0 {
			t.Fatal("empty page with a next page token")
		}
		opts.PageToken = next
	}
}

func testListPaging(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	// Byte order, not dictionary order: "a-c" < "a0" < "ab" whatever the
	// database's locale.
	names := []string{"ab", "a-c", "a0", "x1", "x-1", "zz", "m", "b-2", "b10", "b2"}
	var all, inB []string
	for _, space := range []string{"b", "a", "c-d", "c0"} {
		for _, n := range names {
			mustCreate(t, ctx, s.Actors(), newActor(space, n))
			all = append(all, space+"/"+n)
			if space == "b" {
				inB = append(inB, space+"/"+n)
			}
		}
	}
	byKey := func(x, y string) int {
		xs, xn, _ := strings.Cut(x, "/")
		ys, yn, _ := strings.Cut(y, "/")
		return cmp.Or(strings.Compare(xs, ys), strings.Compare(xn, yn))
	}
	slices.SortFunc(all, byKey)
	slices.SortFunc(inB, byKey)

	for _, size := range []int{1, 3, 7, len(all), 0} {
		t.Run(fmt.Sprintf("page size %d", size), func(t *testing.T) {
			if got := listAll(t, ctx, s.Actors(), store.ListOptions{PageSize: size}); !slices.Equal(got, all) {
				t.Errorf("all spaces:\n got  %v\n want %v", got, all)
			}
			if got := listAll(t, ctx, s.Actors(), store.ListOptions{Space: "b", PageSize: size}); !slices.Equal(got, inB) {
				t.Errorf("space b:\n got  %v\n want %v", got, inB)
			}
		})
	}
}

func testListPageSizes(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	const n = store.MaxPageSize + 1
	err := s.InTx(ctx, func(tx store.Tx) error {
		for i := range n {
			if _, err := tx.Workers().Create(ctx, newWorker("pool", fmt.Sprintf("w%04d", i), "node-1", "default")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		size     int
		wantLen  int
		wantNext bool
	}{
		{"default", 0, store.DefaultPageSize, true},
		{"negative means default", -5, store.DefaultPageSize, true},
		{"capped at the maximum", 5 * store.MaxPageSize, store.MaxPageSize, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			items, next, err := s.Workers().List(ctx, store.ListOptions{PageSize: tc.size})
			if err != nil {
				t.Fatal(err)
			}
			if len(items) != tc.wantLen || (next != "") != tc.wantNext {
				t.Errorf("got %d items, next %q; want %d items, next page %v", len(items), next, tc.wantLen, tc.wantNext)
			}
		})
	}
	t.Run("the last page ends the list", func(t *testing.T) {
		_, next, err := s.Workers().List(ctx, store.ListOptions{PageSize: store.MaxPageSize})
		if err != nil {
			t.Fatal(err)
		}
		last, next, err := s.Workers().List(ctx, store.ListOptions{PageSize: store.MaxPageSize, PageToken: next})
		if err != nil {
			t.Fatal(err)
		}
		if len(last) != 1 || keyOf(last[0]) != fmt.Sprintf("pool/w%04d", n-1) || next != "" {
			t.Errorf("last page = %d items, next %q; want pool/w%04d alone and no next page", len(last), next, n-1)
		}
	})
}

func testListFilters(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	running := func(a *torporv1.Actor, worker string) *torporv1.Actor {
		a.Status.State = torporv1.ActorState_ACTOR_STATE_RUNNING
		a.Status.Worker = &torporv1.WorkerRef{Namespace: "torpor", Name: worker}
		return a
	}
	otherTemplate := newActor("s1", "c")
	otherTemplate.Spec.Template, otherTemplate.Spec.TemplateRevision = "python", 2
	for _, a := range []*torporv1.Actor{
		newActor("s1", "a"), running(newActor("s1", "b"), "slot-1"), otherTemplate,
		running(newActor("s2", "a"), "slot-2"), newActor("s2", "b"),
	} {
		mustCreate(t, ctx, s.Actors(), a)
	}
	busy := newWorker("torpor", "slot-1", "node-1", "small")
	busy.Status.Actor = &torporv1.ActorRef{Space: "s1", Name: "b", Uid: "uid-b"}
	for _, w := range []*torporv1.Worker{
		busy, newWorker("torpor", "slot-2", "node-1", "large"), newWorker("torpor", "slot-3", "node-2", "small"),
	} {
		mustCreate(t, ctx, s.Workers(), w)
	}
	for _, sn := range []*torporv1.Snapshot{
		{Metadata: meta("s1", "snap-1"), ActorUid: "uid-a", Node: "node-1", TemplateUid: "uid-base-1"},
		{Metadata: meta("s1", "snap-2"), ActorUid: "uid-a", TemplateUid: "uid-base-2", Location: "s1/uid-a/snap-2"},
		{Metadata: meta("s1", "snap-3"), ActorUid: "uid-b", Node: "node-1", TemplateUid: "uid-base-1"},
		// A fork in another space shares snap-2's files.
		{Metadata: meta("s2", "snap-4"), ActorUid: "uid-f", TemplateUid: "uid-base-2", Location: "s1/uid-a/snap-2", ForkedFrom: "s1/snap-2"},
	} {
		mustCreate(t, ctx, s.Snapshots(), sn)
	}
	for _, tag := range []*torporv1.SnapshotTag{
		{Metadata: meta("s1", "v1"), Snapshot: "snap-2"},
		{Metadata: meta("s1", "v2"), Snapshot: "snap-2"},
		{Metadata: meta("s2", "v1"), Snapshot: "snap-4"},
	} {
		mustCreate(t, ctx, s.Tags(), tag)
	}
	ready := &torporv1.Template{Metadata: meta("s1", "python"), Status: &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_READY}}
	mustCreate(t, ctx, s.Templates(), ready)
	mustCreate(t, ctx, s.Templates(), &torporv1.Template{Metadata: meta("s1", "base")})
	for _, r := range []*torporv1.Template{
		{Metadata: meta("s1", "base@1"), Status: &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_READY}},
		{Metadata: meta("s1", "base@2"), Status: &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING}},
		{Metadata: meta("s1", "python@1"), Status: &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_PENDING}},
	} {
		mustCreate(t, ctx, s.Revisions(), r)
	}

	listers := map[string]func(store.ListOptions) []string{
		"actors":    func(o store.ListOptions) []string { return listAll(t, ctx, s.Actors(), o) },
		"workers":   func(o store.ListOptions) []string { return listAll(t, ctx, s.Workers(), o) },
		"snapshots": func(o store.ListOptions) []string { return listAll(t, ctx, s.Snapshots(), o) },
		"templates": func(o store.ListOptions) []string { return listAll(t, ctx, s.Templates(), o) },
		"revisions": func(o store.ListOptions) []string { return listAll(t, ctx, s.Revisions(), o) },
		"tags":      func(o store.ListOptions) []string { return listAll(t, ctx, s.Tags(), o) },
	}
	actors := listers["actors"]
	cases := []struct {
		name string
		kind string
		opts store.ListOptions
		want []string
	}{
		{"actors by state", "actors", store.ListOptions{Filter: store.Filter{"state": "ACTOR_STATE_RUNNING"}}, []string{"s1/b", "s2/a"}},
		{"actors by short state", "actors", store.ListOptions{Filter: store.Filter{"state": "suspended"}}, []string{"s1/a", "s1/c", "s2/b"}},
		{"actors by state in a space", "actors", store.ListOptions{Space: "s2", Filter: store.Filter{"state": "RUNNING"}}, []string{"s2/a"}},
		{"actors by state, paged", "actors", store.ListOptions{PageSize: 1, Filter: store.Filter{"state": "SUSPENDED"}}, []string{"s1/a", "s1/c", "s2/b"}},
		{"actors by template revision", "actors", store.ListOptions{Filter: store.Filter{"template": "python@2"}}, []string{"s1/c"}},
		{"actors by another revision", "actors", store.ListOptions{Filter: store.Filter{"template": "python@1"}}, nil},
		{"actors by worker", "actors", store.ListOptions{Filter: store.Filter{"worker": store.WorkerKey("torpor", "slot-2")}}, []string{"s2/a"}},
		{"actors without worker", "actors", store.ListOptions{Filter: store.Filter{"worker": ""}}, []string{"s1/a", "s1/c", "s2/b"}},
		{"actors by two fields", "actors", store.ListOptions{Filter: store.Filter{"state": "SUSPENDED", "template": "base@1"}}, []string{"s1/a", "s2/b"}},
		{"no match", "actors", store.ListOptions{Filter: store.Filter{"state": "PAUSED"}}, nil},
		{"free workers", "workers", store.ListOptions{Filter: store.Filter{"actor": ""}}, []string{"torpor/slot-2", "torpor/slot-3"}},
		{"workers by actor", "workers", store.ListOptions{Filter: store.Filter{"actor": "uid-b"}}, []string{"torpor/slot-1"}},
		{"workers by node", "workers", store.ListOptions{Filter: store.Filter{"node": "node-1"}}, []string{"torpor/slot-1", "torpor/slot-2"}},
		{"free workers of a pool", "workers", store.ListOptions{Filter: store.Filter{"pool": "small", "actor": ""}}, []string{"torpor/slot-3"}},
		{"snapshots by actor", "snapshots", store.ListOptions{Filter: store.Filter{"actor_uid": "uid-a"}}, []string{"s1/snap-1", "s1/snap-2"}},
		{"snapshots by node", "snapshots", store.ListOptions{Filter: store.Filter{"node": "node-1"}}, []string{"s1/snap-1", "s1/snap-3"}},
		{"snapshots by template revision", "snapshots", store.ListOptions{Filter: store.Filter{"template_uid": "uid-base-1"}}, []string{"s1/snap-1", "s1/snap-3"}},
		{"snapshots by location, across spaces", "snapshots", store.ListOptions{Filter: store.Filter{"location": "s1/uid-a/snap-2"}}, []string{"s1/snap-2", "s2/snap-4"}},
		{"tags of a snapshot", "tags", store.ListOptions{Space: "s1", Filter: store.Filter{"snapshot": "snap-2"}}, []string{"s1/v1", "s1/v2"}},
		{"tags of another space's snapshot", "tags", store.ListOptions{Space: "s2", Filter: store.Filter{"snapshot": "snap-2"}}, nil},
		{"templates by phase", "templates", store.ListOptions{Filter: store.Filter{"phase": "READY"}}, []string{"s1/python"}},
		{"revisions by phase", "revisions", store.ListOptions{Filter: store.Filter{"phase": "PENDING"}}, []string{"s1/base@2", "s1/python@1"}},
		{"revisions of a template", "revisions", store.ListOptions{Filter: store.Filter{"template": "base"}}, []string{"s1/base@1", "s1/base@2"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := listers[tc.kind](tc.opts); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}

	t.Run("updates move records between filters", func(t *testing.T) {
		a := mustGet(t, ctx, s.Actors(), "s1", "a")
		a.Status.State = torporv1.ActorState_ACTOR_STATE_CRASHED
		if _, err := s.Actors().Update(ctx, a); err != nil {
			t.Fatal(err)
		}
		if got := actors(store.ListOptions{Filter: store.Filter{"state": "CRASHED"}}); !slices.Equal(got, []string{"s1/a"}) {
			t.Errorf("crashed actors = %v, want [s1/a]", got)
		}
		if got := actors(store.ListOptions{Filter: store.Filter{"state": "SUSPENDED"}}); slices.Contains(got, "s1/a") {
			t.Errorf("suspended actors = %v still hold s1/a", got)
		}
	})
}

func testListBadInput(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	for _, n := range []string{"a", "b"} {
		mustCreate(t, ctx, s.Actors(), newActor("s1", n))
	}
	_, tokenOfS1, err := s.Actors().List(ctx, store.ListOptions{Space: "s1", PageSize: 1})
	if err != nil || tokenOfS1 == "" {
		t.Fatalf("first page: token %q, err %v", tokenOfS1, err)
	}
	cases := []struct {
		name     string
		list     func() error
		mentions []string
	}{
		{"unknown filter field", func() error {
			_, _, err := s.Actors().List(ctx, store.ListOptions{Filter: store.Filter{"colour": "red"}})
			return err
		}, []string{`"colour"`, "state"}},
		{"nodes have no filters", func() error {
			_, _, err := s.Nodes().List(ctx, store.ListOptions{Filter: store.Filter{"state": "RUNNING"}})
			return err
		}, []string{"nodes", `"state"`}},
		{"unknown enum value", func() error {
			_, _, err := s.Actors().List(ctx, store.ListOptions{Filter: store.Filter{"state": "SLEEPING"}})
			return err
		}, []string{"state", "SLEEPING"}},
		{"malformed page token", func() error {
			_, _, err := s.Actors().List(ctx, store.ListOptions{PageToken: "!!not a token"})
			return err
		}, []string{"page token"}},
		{"page token of another space", func() error {
			_, _, err := s.Actors().List(ctx, store.ListOptions{Space: "s2", PageToken: tokenOfS1})
			return err
		}, []string{"page token", "s1", "s2"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, tc.list(), store.ErrInvalidArgument, tc.mentions...)
		})
	}
}

func testTxCommit(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	err := s.InTx(ctx, func(tx store.Tx) error {
		if _, err := tx.Actors().Create(ctx, newActor("default", "web")); err != nil {
			return err
		}
		w, err := tx.Workers().Create(ctx, newWorker("torpor", "slot-0", "node-1", "default"))
		if err != nil {
			return err
		}
		// The transaction reads its own writes.
		a, err := tx.Actors().Get(ctx, "default", "web")
		if err != nil {
			return err
		}
		return claim(ctx, tx, a, w)
	})
	if err != nil {
		t.Fatal(err)
	}
	a := mustGet(t, ctx, s.Actors(), "default", "web")
	w := mustGet(t, ctx, s.Workers(), "torpor", "slot-0")
	if a.GetStatus().GetWorker().GetUid() != w.GetMetadata().GetUid() || w.GetStatus().GetActor().GetUid() != a.GetMetadata().GetUid() {
		t.Fatalf("actor and worker do not point at each other:\n actor  %v\n worker %v", a, w)
	}
}

func testTxRollbackOnError(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	before := mustCreate(t, ctx, s.Actors(), newActor("default", "existing"))
	errBoom := errors.New("boom")
	err := s.InTx(ctx, func(tx store.Tx) error {
		if _, err := tx.Actors().Create(ctx, newActor("default", "web")); err != nil {
			return err
		}
		a := proto.CloneOf(before)
		a.Status.State = torporv1.ActorState_ACTOR_STATE_CRASHED
		if _, err := tx.Actors().Update(ctx, a); err != nil {
			return err
		}
		if err := tx.AppendEvent(ctx, store.Event{ActorUID: before.GetMetadata().GetUid(), Reason: "crash"}); err != nil {
			return err
		}
		return errBoom
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("InTx = %v, want fn's error", err)
	}
	_, err = s.Actors().Get(ctx, "default", "web")
	wantErr(t, err, store.ErrNotFound)
	wantEqual(t, "updated record after rollback", mustGet(t, ctx, s.Actors(), "default", "existing"), before)
	if evs, err := s.Events(ctx, before.GetMetadata().GetUid(), 0); err != nil || len(evs) != 0 {
		t.Fatalf("events after rollback = %v, %v; want none", evs, err)
	}
}

func testTxRollbackOnPanic(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic of fn", r)
			}
		}()
		_ = s.InTx(ctx, func(tx store.Tx) error {
			if _, err := tx.Actors().Create(ctx, newActor("default", "web")); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	_, err := s.Actors().Get(ctx, "default", "web")
	wantErr(t, err, store.ErrNotFound)
	// The transaction's connection was released: writes still go through.
	writeCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := s.Actors().Create(writeCtx, newActor("default", "after")); err != nil {
		t.Fatalf("write after a panicking transaction: %v", err)
	}
}

func testTxStaleWrite(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	a := mustCreate(t, ctx, s.Actors(), newActor("default", "web"))
	stale := mustCreate(t, ctx, s.Workers(), newWorker("torpor", "slot-0", "node-1", "default"))
	// Someone else changes the worker after it was read.
	bumped := proto.CloneOf(stale)
	bumped.Spec.Ip = "10.0.0.9"
	if _, err := s.Workers().Update(ctx, bumped); err != nil {
		t.Fatal(err)
	}
	err := s.InTx(ctx, func(tx store.Tx) error {
		// claim writes the worker first; write the actor first here so the
		// rollback has something to undo.
		resuming := proto.CloneOf(a)
		resuming.Status.State = torporv1.ActorState_ACTOR_STATE_RESUMING
		if _, err := tx.Actors().Update(ctx, resuming); err != nil {
			return err
		}
		w := proto.CloneOf(stale)
		w.Status.Actor = &torporv1.ActorRef{Space: "default", Name: "web", Uid: a.GetMetadata().GetUid()}
		_, err := tx.Workers().Update(ctx, w)
		return err
	})
	wantErr(t, err, store.ErrConflict, "worker torpor/slot-0")
	wantEqual(t, "actor after the rolled back claim", mustGet(t, ctx, s.Actors(), "default", "web"), a)
}

// testConcurrentClaim pins DESIGN invariant 1: actors racing for one free
// worker in concurrent transactions; exactly one gets it, and actor and
// worker point at each other. The worker is read either inside each
// transaction or once before all of them (as a scheduler that picked it
// from a list would), which makes every claimer race with the same version.
func testConcurrentClaim(t *testing.T, b backend) {
	for _, variant := range []struct {
		name       string
		readInside bool
	}{{"worker read in the transaction", true}, {"worker read before the transactions", false}} {
		readInside := variant.readInside
		t.Run(variant.name, func(t *testing.T) {
			ctx, s := fresh(t, b)
			const claimers = 8
			picked := mustCreate(t, ctx, s.Workers(), newWorker("torpor", "slot-0", "node-1", "default"))
			for i := range claimers {
				mustCreate(t, ctx, s.Actors(), newActor("default", fmt.Sprintf("a%d", i)))
			}
			start := make(chan struct{})
			errs := make([]error, claimers)
			var wg sync.WaitGroup
			for i := range claimers {
				wg.Go(func() {
					<-start
					errs[i] = s.InTx(ctx, func(tx store.Tx) error {
						w := picked
						if readInside {
							var err error
							if w, err = tx.Workers().Get(ctx, "torpor", "slot-0"); err != nil {
								return err
							}
						}
						a, err := tx.Actors().Get(ctx, "default", fmt.Sprintf("a%d", i))
						if err != nil {
							return err
						}
						return claim(ctx, tx, a, w)
					})
				})
			}
			close(start)
			wg.Wait()
			checkOneClaim(t, ctx, s, errs)
		})
	}
}

func checkOneClaim(t *testing.T, ctx context.Context, s store.Store, errs []error) {
	t.Helper()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("claimers a%d and a%d both got the worker", winner, i)
			}
			winner = i
		case errors.Is(err, errWorkerBusy), errors.Is(err, store.ErrConflict):
		default:
			t.Errorf("claimer a%d: %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatalf("no claimer got the free worker: %v", errs)
	}
	w := mustGet(t, ctx, s.Workers(), "torpor", "slot-0")
	for i := range errs {
		a := mustGet(t, ctx, s.Actors(), "default", fmt.Sprintf("a%d", i))
		hasWorker := a.GetStatus().GetWorker().GetUid() == w.GetMetadata().GetUid()
		isWorkers := w.GetStatus().GetActor().GetUid() == a.GetMetadata().GetUid()
		if want := i == winner; hasWorker != want || isWorkers != want {
			t.Errorf("a%d (winner a%d): actor holds worker %v, worker holds actor %v", i, winner, hasWorker, isWorkers)
		}
	}
}

func testEvents(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	base := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	states := []torporv1.ActorState{
		torporv1.ActorState_ACTOR_STATE_SUSPENDED, torporv1.ActorState_ACTOR_STATE_RESUMING,
		torporv1.ActorState_ACTOR_STATE_RUNNING, torporv1.ActorState_ACTOR_STATE_SUSPENDING,
		torporv1.ActorState_ACTOR_STATE_SUSPENDED, torporv1.ActorState_ACTOR_STATE_RESUMING,
	}
	var want []store.Event
	for i := 1; i < len(states); i++ {
		ev := store.Event{
			ActorUID: "actor-1",
			// Equal times: order is the order of appending.
			Time:        base.Add(time.Duration(i/2) * time.Second),
			FromState:   states[i-1],
			ToState:     states[i],
			Reason:      fmt.Sprintf("step %d", i),
			OperationID: fmt.Sprintf("op-%d", i),
			Worker:      "torpor/slot-0",
			Duration:    time.Duration(i) * 1234567 * time.Nanosecond,
		}
		want = append(want, ev)
		if err := s.AppendEvent(ctx, ev); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendEvent(ctx, store.Event{ActorUID: "actor-2", Reason: "other"}); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name  string
		limit int
		want  []store.Event
	}{
		{"all", 0, want},
		{"negative limit is all", -1, want},
		{"latest two", 2, want[len(want)-2:]},
		{"limit above count", 100, want},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.Events(ctx, "actor-1", tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, tc.want, func(a, b store.Event) bool { return a == b }) {
				t.Errorf("events:\n got  %+v\n want %+v", got, tc.want)
			}
		})
	}
	t.Run("zero time is now", func(t *testing.T) {
		before := time.Now().Add(-time.Second)
		got, err := s.Events(ctx, "actor-2", 1)
		if err != nil || len(got) != 1 {
			t.Fatalf("events = %v, %v", got, err)
		}
		if got[0].Time.Before(before.Add(-time.Minute)) || got[0].Time.After(time.Now().Add(time.Second)) {
			t.Errorf("time = %v, want about now", got[0].Time)
		}
	})
	t.Run("unknown actor has none", func(t *testing.T) {
		got, err := s.Events(ctx, "nobody", 0)
		if err != nil || len(got) != 0 {
			t.Errorf("events = %v, %v; want none", got, err)
		}
	})
	t.Run("actor uid is required", func(t *testing.T) {
		wantErr(t, s.AppendEvent(ctx, store.Event{Reason: "x"}), store.ErrInvalidArgument, "actor uid")
	})
}

func testReopen(t *testing.T, b backend) {
	ctx := testContext(t)
	url := b.freshURL(t)
	first, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	created := mustCreate(t, ctx, first.Actors(), newActor("default", "web"))
	ev := store.Event{ActorUID: created.GetMetadata().GetUid(), Time: time.Now().UTC().Truncate(time.Microsecond), Reason: "created"}
	if err := first.AppendEvent(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	s := openStore(t, ctx, url)
	wantEqual(t, "actor after reopen", mustGet(t, ctx, s.Actors(), "default", "web"), created)
	evs, err := s.Events(ctx, created.GetMetadata().GetUid(), 0)
	if err != nil || len(evs) != 1 || evs[0] != ev {
		t.Errorf("events after reopen = %+v, %v; want [%+v]", evs, err, ev)
	}
	if got := listAll(t, ctx, s.Spaces(), store.ListOptions{}); !slices.Equal(got, []string{"/default"}) {
		t.Errorf("spaces after reopen = %v, want the default space once", got)
	}
}

// testConcurrentOpen starts several stores on one empty database at once,
// as replicas of the server do.
func testConcurrentOpen(t *testing.T, b backend) {
	ctx := testContext(t)
	url := b.freshURL(t)
	const n = 4
	stores := make([]store.Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { stores[i], errs[i] = store.Open(ctx, url) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("open %d: %v", i, errs[i])
			continue
		}
		t.Cleanup(func() { stores[i].Close() })
	}
	if t.Failed() {
		return
	}
	if got := listAll(t, ctx, stores[n-1].Spaces(), store.ListOptions{}); !slices.Equal(got, []string{"/default"}) {
		t.Errorf("spaces = %v, want the default space once", got)
	}
}

func TestOpenRejectsBadURLs(t *testing.T) {
	cases := []struct {
		url     string
		mention string
	}{
		{"mysql://localhost/torpor", `unknown scheme "mysql"`},
		{"/var/lib/torpor.db", "unknown scheme"},
		{"sqlite:", "file path"},
		{"sqlite::memory:", "not supported"},
		{"sqlite:/tmp/x.db?cache=shared", "must not contain"},
		{"postgres://user:secret@127.0.0.1:5432/db?sslmode=bogus", "sslmode"},
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			s, err := store.Open(testContext(t), tc.url)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error %q leaks the password", err)
			}
		})
	}
}

// TestOpenPostgresSchemaNames checks that the schema Open creates is the
// one PostgreSQL then searches, however search_path spells it.
func TestOpenPostgresSchemaNames(t *testing.T) {
	for _, spell := range []func(schema string) string{
		func(s string) string { return strings.ToUpper(s) },
		func(s string) string { return `"` + s + `", public` },
	} {
		base := storetest.URL(t, "postgres")
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		schema := q.Get("search_path")
		q.Set("search_path", spell(schema))
		u.RawQuery = q.Encode()
		t.Run(q.Get("search_path"), func(t *testing.T) {
			ctx := testContext(t)
			s := openStore(t, ctx, u.String())
			mustGet(t, ctx, s.Spaces(), "", store.DefaultSpace)
		})
	}
}
