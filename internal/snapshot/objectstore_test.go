package snapshot

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/snapshot/s3test"
)

// objectStoreBackends open an empty store of each backend (prefix: the
// key prefix, where the backend has one).
var objectStoreBackends = []struct {
	name string
	open func(t *testing.T, prefix string) ObjectStore
}{
	{"dir", func(t *testing.T, _ string) ObjectStore { return newDirStore(t) }},
	{"s3", func(t *testing.T, prefix string) ObjectStore {
		s, err := Open(context.Background(), s3test.Location(t, prefix))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
}

// TestObjectStores holds every backend to the ObjectStore contract.
func TestObjectStores(t *testing.T) {
	for _, b := range objectStoreBackends {
		t.Run(b.name, func(t *testing.T) {
			for _, prefix := range []string{"", "team/torpor"} {
				testObjectStore(t, b.open(t, prefix))
			}
		})
	}
}

func testObjectStore(t *testing.T, s ObjectStore) {
	ctx := t.Context()
	read := func(key string) (string, error) {
		t.Helper()
		r, err := s.Get(ctx, key)
		if err != nil {
			return "", err
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		return string(b), err
	}
	put := func(key, value string) {
		t.Helper()
		if err := s.Put(ctx, key, strings.NewReader(value)); err != nil {
			t.Fatalf("Put(%s): %v", key, err)
		}
	}
	if _, err := read("a/missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of a missing object: %v, want ErrNotFound", err)
	}
	put("a/1", "one")
	put("a/1", "one, replaced")
	put("a/2", strings.Repeat("x", 1<<20))
	put("ab/3", "sibling prefix")
	put("b/4", "")
	if got, err := read("a/1"); err != nil || got != "one, replaced" {
		t.Errorf("Get(a/1) = %q, %v; want the replacement", got, err)
	}
	if got, err := read("b/4"); err != nil || got != "" {
		t.Errorf("Get(b/4) = %q, %v; want an empty object", got, err)
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"a/", []string{"a/1", "a/2"}},
		{"a", []string{"a/1", "a/2", "ab/3"}},
		{"", []string{"a/1", "a/2", "ab/3", "b/4"}},
		{"c/", nil},
	} {
		objs, err := s.List(ctx, tc.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", tc.prefix, err)
		}
		var keys []string
		for _, o := range objs {
			keys = append(keys, o.Key)
			if o.Key == "a/2" && o.Size != 1<<20 {
				t.Errorf("List: a/2 has size %d, want %d", o.Size, 1<<20)
			}
		}
		if !slices.Equal(keys, tc.want) {
			t.Errorf("List(%q) = %v, want %v", tc.prefix, keys, tc.want)
		}
	}
	if err := s.Delete(ctx, "a/1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "a/1"); err != nil {
		t.Errorf("deleting a missing object: %v, want no error", err)
	}
	if _, err := read("a/1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Delete: %v, want ErrNotFound", err)
	}
	for _, key := range []string{"../escape", "a//b", "/abs", ""} {
		if err := s.Put(ctx, key, strings.NewReader("x")); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Put(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
	for _, key := range []string{"a/2", "ab/3", "b/4"} {
		if err := s.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenLocations(t *testing.T) {
	for _, tc := range []struct {
		location, want string
	}{
		{"s3://", "bucket is required"},
		{"s3://b?endpoint=127.0.0.1:1&insecure=maybe", "insecure"},
		{"s3://b?endpointt=x", "unknown parameter"},
		{"s3://b/../x?endpoint=127.0.0.1:1", "invalid object key"},
		{"gs://bucket", "want a directory or s3://"},
	} {
		if _, err := Open(context.Background(), tc.location); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q) = %v, want an error containing %q", tc.location, err, tc.want)
		}
	}
}
