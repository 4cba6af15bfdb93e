package store

import (
	"context"
	"errors"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// pagedSpaces serves List from pages, two records each, and records the
// options of every call.
type pagedSpaces struct {
	Collection[*torporv1.Space]
	pages [][]*torporv1.Space
	fail  error // returned by the call after the last page
	calls []ListOptions
}

func (p *pagedSpaces) List(_ context.Context, opts ListOptions) ([]*torporv1.Space, string, error) {
	p.calls = append(p.calls, opts)
	i := len(p.calls) - 1
	if i >= len(p.pages) {
		return nil, "", p.fail
	}
	next := ""
	if i+1 < len(p.pages) || p.fail != nil {
		next = p.pages[i][len(p.pages[i])-1].GetMetadata().GetName()
	}
	return p.pages[i], next, nil
}

func spaces(names ...string) []*torporv1.Space {
	var out []*torporv1.Space
	for _, n := range names {
		out = append(out, &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: n}})
	}
	return out
}

func names(objs []*torporv1.Space) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetMetadata().GetName())
	}
	return out
}

func TestListAllFollowsPageTokens(t *testing.T) {
	c := &pagedSpaces{pages: [][]*torporv1.Space{spaces("a", "b"), spaces("c", "d"), spaces("e")}}
	got, err := ListAll(context.Background(), c, ListOptions{Space: "s", Filter: Filter{"state": "RUNNING"}, PageSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	if g := names(got); len(g) != 5 || g[0] != "a" || g[4] != "e" {
		t.Fatalf("ListAll = %v, want a..e", g)
	}
	wantTokens := []string{"", "b", "d"}
	if len(c.calls) != len(wantTokens) {
		t.Fatalf("%d List calls, want %d", len(c.calls), len(wantTokens))
	}
	for i, opts := range c.calls {
		if opts.PageToken != wantTokens[i] || opts.PageSize != MaxPageSize || opts.Space != "s" || opts.Filter["state"] != "RUNNING" {
			t.Errorf("call %d: %+v; want token %q, page size %d, the caller's space and filter", i, opts, wantTokens[i], MaxPageSize)
		}
	}
}

func TestAllEndsWithTheError(t *testing.T) {
	boom := errors.New("boom")
	c := &pagedSpaces{pages: [][]*torporv1.Space{spaces("a", "b")}, fail: boom}
	if got, err := ListAll(context.Background(), c, ListOptions{}); !errors.Is(err, boom) || got != nil {
		t.Fatalf("ListAll = %v, %v; want nothing and the error", names(got), err)
	}
}

func TestAllStopsWhenTheCallerDoes(t *testing.T) {
	c := &pagedSpaces{pages: [][]*torporv1.Space{spaces("a", "b"), spaces("c")}}
	for obj, err := range All(context.Background(), c, ListOptions{}) {
		if err != nil || obj.GetMetadata().GetName() != "a" {
			t.Fatalf("first = %v, %v", obj, err)
		}
		break
	}
	if len(c.calls) != 1 {
		t.Errorf("%d List calls after the caller stopped at the first record, want 1", len(c.calls))
	}
}
