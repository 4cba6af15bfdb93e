package store_test

import (
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
