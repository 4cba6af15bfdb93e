package store_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store"
)

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
