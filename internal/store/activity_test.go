package store_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/store"
)

// TestActivityConformance: both backends keep activity reports alike.
func TestActivityConformance(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, b backend)
	}{
		{"reports merge per actor and reporter", testActivityMerge},
		{"a batch larger than a statement", testActivityLargeBatch},
		{"replicas share reports", testActivityReplicas},
		{"prune", testActivityPrune},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) { tc.run(t, b) })
			}
		})
	}
}

func activityByReporter(t *testing.T, got []store.Activity) map[string]store.Activity {
	t.Helper()
	m := map[string]store.Activity{}
	for _, a := range got {
		m[a.Space+"/"+a.Name+"@"+a.Reporter] = a
	}
	return m
}

func testActivityMerge(t *testing.T, b backend) {
	ctx, st := fresh(t, b)
	t0 := time.Now().UTC().Truncate(time.Microsecond)
	before := time.Now().Add(-time.Second)
	if err := st.RecordActivity(ctx, []store.Activity{
		{Space: "default", Name: "a", Reporter: "r1", LastActive: t0, InFlight: 2},
		{Space: "default", Name: "a", Reporter: "r2", LastActive: t0.Add(-time.Minute), InFlight: 1},
		{Space: "default", Name: "b", Reporter: "r1", LastActive: t0},
		// Twice in one batch: the later time and the last count win.
		{Space: "default", Name: "b", Reporter: "r1", LastActive: t0.Add(-time.Hour), InFlight: 3},
	}); err != nil {
		t.Fatalf("record: %v", err)
	}
	// A report with an older time does not move last_active back, but
	// replaces the in-flight count.
	if err := st.RecordActivity(ctx, []store.Activity{{Space: "default", Name: "a", Reporter: "r1", LastActive: t0.Add(-time.Hour), InFlight: 0}}); err != nil {
		t.Fatalf("record: %v", err)
	}
	got, err := st.ActivityOf(ctx, []store.ActivityKey{{Space: "default", Name: "a"}, {Space: "default", Name: "b"}, {Space: "default", Name: "none"}})
	if err != nil {
		t.Fatalf("activity: %v", err)
	}
	m := activityByReporter(t, got)
	if len(m) != 3 {
		t.Fatalf("got %d records, want 3: %+v", len(m), got)
	}
	for key, want := range map[string]struct {
		last     time.Time
		inFlight int
	}{
		"default/a@r1": {t0, 0},
		"default/a@r2": {t0.Add(-time.Minute), 1},
		"default/b@r1": {t0, 3},
	} {
		a := m[key]
		if !a.LastActive.Equal(want.last) || a.InFlight != want.inFlight {
			t.Errorf("%s: last active %s, in flight %d; want %s, %d", key, a.LastActive, a.InFlight, want.last, want.inFlight)
		}
		if a.ReportTime.Before(before) || a.ReportTime.After(time.Now().Add(time.Second)) {
			t.Errorf("%s: report time %s is not the time of the report", key, a.ReportTime)
		}
	}
	err = st.RecordActivity(ctx, []store.Activity{{Space: "default", Name: "a", LastActive: t0}})
	if err == nil || !strings.Contains(err.Error(), "reporter") {
		t.Errorf("a report without a reporter: %v, want an error naming the reporter", err)
	}
}

func testActivityLargeBatch(t *testing.T, b backend) {
	ctx, st := fresh(t, b)
	const n = 1203
	t0 := time.Now().UTC()
	reports := make([]store.Activity, n)
	keys := make([]store.ActivityKey, n)
	for i := range reports {
		name := fmt.Sprintf("actor-%d", i)
		reports[i] = store.Activity{Space: "default", Name: name, Reporter: "r", LastActive: t0, InFlight: i % 2}
		keys[i] = store.ActivityKey{Space: "default", Name: name}
	}
	if err := st.RecordActivity(ctx, reports); err != nil {
		t.Fatalf("record %d: %v", n, err)
	}
	got, err := st.ActivityOf(ctx, keys)
	if err != nil {
		t.Fatalf("activity: %v", err)
	}
	if len(got) != n {
		t.Fatalf("got %d records, want %d", len(got), n)
	}
}

func testActivityReplicas(t *testing.T, b backend) {
	ctx := testContext(t)
	url := b.freshURL(t)
	replicas := []store.Store{openStore(t, ctx, url), openStore(t, ctx, url)}
	t0 := time.Now().UTC().Truncate(time.Microsecond)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Go(func() {
			errs <- replicas[i%2].RecordActivity(ctx, []store.Activity{{Space: "default", Name: "a", Reporter: "r", LastActive: t0.Add(time.Duration(i) * time.Millisecond), InFlight: 1}})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent reports: %v", err)
		}
	}
	for i, st := range replicas {
		got, err := st.ActivityOf(ctx, []store.ActivityKey{{Space: "default", Name: "a"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || !got[0].LastActive.Equal(t0.Add(19*time.Millisecond)) {
			t.Errorf("replica %d reads %+v, want one record at the latest time %s", i, got, t0.Add(19*time.Millisecond))
		}
	}
}

func testActivityPrune(t *testing.T, b backend) {
	ctx, st := fresh(t, b)
	if err := st.RecordActivity(ctx, []store.Activity{{Space: "default", Name: "old", Reporter: "r", LastActive: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	time.Sleep(2 * time.Millisecond) // report times are kept to the microsecond
	if err := st.RecordActivity(ctx, []store.Activity{{Space: "default", Name: "new", Reporter: "r", LastActive: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	n, err := st.PruneActivity(ctx, cut)
	if err != nil || n != 1 {
		t.Fatalf("prune: %d, %v; want 1 removed", n, err)
	}
	got, err := st.ActivityOf(ctx, []store.ActivityKey{{Space: "default", Name: "old"}, {Space: "default", Name: "new"}})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, a := range got {
		names = append(names, a.Name)
	}
	if !slices.Equal(names, []string{"new"}) {
		t.Errorf("after prune: %v, want [new]", names)
	}
}
