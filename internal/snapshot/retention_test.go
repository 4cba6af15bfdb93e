package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// age backdates every object of location in a DirStore.
func age(t *testing.T, s *DirStore, location string, by time.Duration) {
	t.Helper()
	objs, err := s.List(t.Context(), location+"/")
	if err != nil || len(objs) == 0 {
		t.Fatalf("list %s: %v %v", location, objs, err)
	}
	old := time.Now().Add(-by)
	for _, o := range objs {
		if err := os.Chtimes(objectPath(s, o.Key), old, old); err != nil {
			t.Fatal(err)
		}
	}
}

func TestListLocations(t *testing.T) {
	s := newDirStore(t)
	mustUpload(t, s, "default/a/s1", simpleTree("one"))
	mustUpload(t, s, "default/a/s2", simpleTree("two"))
	mustUpload(t, s, "default/ab/s3", simpleTree("three"))
	// An interrupted upload (objects, no manifest) and a half-deleted
	// snapshot (manifest gone first), which a version 1 snapshot can be:
	// a chunked one has nothing but its manifest in its location.
	mustUploadWholeFiles(t, s, "other/a/s4", simpleTree("four"))
	if err := s.Put(t.Context(), "default/a/s5/files/0.zst", strings.NewReader("partial")); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(t.Context(), "other/a/s4/manifest.json"); err != nil {
		t.Fatal(err)
	}
	incomplete := []string{"default/a/s5", "other/a/s4"}

	tests := []struct {
		prefix string
		want   []string
	}{
		{"", []string{"default/a/s1", "default/a/s2", "default/a/s5", "default/ab/s3", "other/a/s4"}},
		{"default", []string{"default/a/s1", "default/a/s2", "default/a/s5", "default/ab/s3"}},
		{"default/a", []string{"default/a/s1", "default/a/s2", "default/a/s5"}},
		{"default/a/s2", []string{"default/a/s2"}},
		{"nope", nil},
	}
	for _, tt := range tests {
		infos, err := ListLocations(t.Context(), s, tt.prefix)
		if err != nil {
			t.Fatalf("ListLocations(%q): %v", tt.prefix, err)
		}
		var got []string
		for _, l := range infos {
			got = append(got, l.Location)
			if wantComplete := !slices.Contains(incomplete, l.Location); l.Complete != wantComplete {
				t.Errorf("%s: Complete = %v, want %v", l.Location, l.Complete, wantComplete)
			}
			if l.Objects == 0 || l.Bytes == 0 || l.LastModified.IsZero() {
				t.Errorf("%s: incomplete info %+v", l.Location, l)
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("ListLocations(%q) = %v, want %v", tt.prefix, got, tt.want)
		}
	}
	for _, bad := range []string{"../x", "a/b/c/d", "a//b"} {
		if _, err := ListLocations(t.Context(), s, bad); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ListLocations(%q) = %v, want ErrInvalidKey", bad, err)
		}
	}
}

func TestDeleteSnapshotRemovesManifestFirst(t *testing.T) {
	base := newDirStore(t)
	store := &recordingStore{ObjectStore: base}
	mustUploadWholeFiles(t, store, "default/a/s1", []treeEntry{
		{path: "x", mode: 0o644, content: "x"},
		{path: "y", mode: 0o644, content: "y"},
	})
	mustUpload(t, store, "default/a/s2", simpleTree("keep"))
	before := len(store.opsLog())
	if err := DeleteSnapshot(t.Context(), store, "default/a/s1"); err != nil {
		t.Fatal(err)
	}
	ops := store.opsLog()[before:]
	want := []string{
		"delete default/a/s1/manifest.json",
		"delete default/a/s1/files/0.zst",
		"delete default/a/s1/files/1.zst",
	}
	if !slices.Equal(ops, want) {
		t.Errorf("delete operations = %v, want %v", ops, want)
	}
	if _, err := os.Stat(filepath.Join(base.Root(), "default", "a", "s1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("deleted snapshot directory remains: %v", err)
	}
	locs, _ := ListLocations(t.Context(), base, "")
	if len(locs) != 1 || locs[0].Location != "default/a/s2" {
		t.Errorf("after delete: %+v, want only default/a/s2", locs)
	}
	if err := DeleteSnapshot(t.Context(), store, "default/a/s1"); err != nil {
		t.Errorf("deleting a deleted snapshot: %v", err)
	}
}

func TestSweepOrphans(t *testing.T) {
	const minAge = time.Hour
	s := newDirStore(t)
	snapshots := []struct {
		location   string
		age        time.Duration
		referenced bool
		complete   bool
		wantSwept  bool
	}{
		{"default/a/old-referenced", 2 * minAge, true, true, false},
		{"default/a/old-orphan", 2 * minAge, false, true, true},
		{"default/b/young-orphan", 0, false, true, false},
		{"default/b/old-incomplete", 2 * minAge, false, false, true},
		{"default/c/young-incomplete", 0, false, false, false},
		{"other/d/old-referenced", 2 * minAge, true, true, false},
	}
	referenced := map[string]bool{}
	for _, sn := range snapshots {
		if sn.complete {
			mustUpload(t, s, sn.location, simpleTree(sn.location))
		} else {
			mustUploadWholeFiles(t, s, sn.location, simpleTree(sn.location))
			if err := s.Delete(t.Context(), manifestKey(sn.location)); err != nil {
				t.Fatal(err)
			}
		}
		if sn.age > 0 {
			age(t, s, sn.location, sn.age)
		}
		referenced[sn.location] = sn.referenced
	}
	var asked []string
	isReferenced := func(_ context.Context, loc string) (bool, error) {
		asked = append(asked, loc)
		return referenced[loc], nil
	}
	swept, err := SweepOrphans(t.Context(), s, isReferenced, minAge)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, sn := range snapshots {
		if sn.wantSwept {
			want = append(want, sn.location)
		}
		locs, _ := ListLocations(t.Context(), s, sn.location)
		if present := len(locs) == 1; present == sn.wantSwept {
			t.Errorf("%s: present after sweep = %v, want %v", sn.location, present, !sn.wantSwept)
		}
		if sn.age == 0 && slices.Contains(asked, sn.location) {
			t.Errorf("%s: young location was looked up; it must be skipped before", sn.location)
		}
	}
	slices.Sort(swept)
	slices.Sort(want)
	if !slices.Equal(swept, want) {
		t.Errorf("swept %v, want %v", swept, want)
	}
}

func TestSweepKeepsLocationsItCannotCheck(t *testing.T) {
	s := newDirStore(t)
	mustUpload(t, s, "default/a/s1", simpleTree("x"))
	age(t, s, "default/a/s1", 2*time.Hour)
	lookupErr := errors.New("store unavailable")
	swept, err := SweepOrphans(t.Context(), s, func(context.Context, string) (bool, error) {
		return false, lookupErr
	}, time.Hour)
	if !errors.Is(err, lookupErr) || len(swept) != 0 {
		t.Fatalf("SweepOrphans with a failing lookup = %v, %v; want the lookup error and nothing swept", swept, err)
	}
	if locs, _ := ListLocations(t.Context(), s, ""); len(locs) != 1 {
		t.Errorf("a location that could not be checked was deleted")
	}
}
