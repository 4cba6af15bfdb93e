package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/torpor-dev/torpor/internal/store"
)

func testSecrets(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	value := []byte("key\x00material\xff")
	t.Run("absent", func(t *testing.T) {
		_, err := s.GetSecret(ctx, "ca")
		wantErr(t, err, store.ErrNotFound, "secret ca")
		wantErr(t, s.DeleteSecret(ctx, "ca"), store.ErrNotFound, "secret ca")
	})
	t.Run("failed create stores nothing", func(t *testing.T) {
		boom := errors.New("no entropy")
		_, err := s.GetOrCreateSecret(ctx, "ca", func() ([]byte, error) { return nil, boom })
		wantErr(t, err, boom, "secret ca")
		_, err = s.GetSecret(ctx, "ca")
		wantErr(t, err, store.ErrNotFound)
	})
	t.Run("created once", func(t *testing.T) {
		calls := 0
		create := func() ([]byte, error) { calls++; return value, nil }
		for range 2 {
			got, err := s.GetOrCreateSecret(ctx, "ca", create)
			if err != nil || !bytes.Equal(got, value) {
				t.Fatalf("GetOrCreateSecret = %q, %v; want %q", got, err, value)
			}
		}
		if calls != 1 {
			t.Errorf("create called %d times, want once", calls)
		}
		if got, err := s.GetSecret(ctx, "ca"); err != nil || !bytes.Equal(got, value) {
			t.Errorf("GetSecret = %q, %v; want %q", got, err, value)
		}
	})
	t.Run("name is required", func(t *testing.T) {
		_, err := s.GetOrCreateSecret(ctx, "", func() ([]byte, error) { return value, nil })
		wantErr(t, err, store.ErrInvalidArgument, "name")
	})
	t.Run("delete", func(t *testing.T) {
		if err := s.DeleteSecret(ctx, "ca"); err != nil {
			t.Fatal(err)
		}
		_, err := s.GetSecret(ctx, "ca")
		wantErr(t, err, store.ErrNotFound)
	})
}

// testListSecrets lists by prefix: names sharing it and nothing else,
// ordered, with no pattern characters in the prefix.
func testListSecrets(t *testing.T, b backend) {
	ctx, s := fresh(t, b)
	for _, name := range []string{"client/b", "client/a", "client0", "clienta", "client_x/z", "token/1"} {
		if _, err := s.GetOrCreateSecret(ctx, name, func() ([]byte, error) { return []byte("v-" + name), nil }); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"client/", []string{"client/a", "client/b"}},
		{"client_", []string{"client_x/z"}},
		{"token/", []string{"token/1"}},
		{"none/", nil},
	} {
		got, err := s.ListSecrets(ctx, tc.prefix)
		if err != nil {
			t.Fatalf("ListSecrets(%q): %v", tc.prefix, err)
		}
		var names []string
		for _, sec := range got {
			names = append(names, sec.Name)
			if string(sec.Data) != "v-"+sec.Name || sec.CreateTime.IsZero() {
				t.Errorf("ListSecrets(%q): %s = %q created %v", tc.prefix, sec.Name, sec.Data, sec.CreateTime)
			}
		}
		if fmt.Sprint(names) != fmt.Sprint(tc.want) {
			t.Errorf("ListSecrets(%q) = %v, want %v", tc.prefix, names, tc.want)
		}
	}
	_, err := s.ListSecrets(ctx, "")
	wantErr(t, err, store.ErrInvalidArgument, "prefix")
}

// testConcurrentSecrets has two stores on one database (two replicas)
// create the same secret at once: all callers get one value. Deleting it
// at once succeeds exactly once.
func testConcurrentSecrets(t *testing.T, b backend) {
	ctx := testContext(t)
	url := b.freshURL(t)
	replicas := []store.Store{openStore(t, ctx, url), openStore(t, ctx, url)}
	const callers = 8
	got := make([][]byte, callers)
	errs := make([]error, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			got[i], errs[i] = replicas[i%2].GetOrCreateSecret(ctx, "ca", func() ([]byte, error) {
				return fmt.Appendf(nil, "made by caller %d", i), nil
			})
		})
	}
	close(start)
	wg.Wait()
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if !bytes.Equal(got[i], got[0]) {
			t.Fatalf("caller %d got %q, caller 0 got %q: replicas disagree", i, got[i], got[0])
		}
	}
	if !bytes.HasPrefix(got[0], []byte("made by caller ")) {
		t.Fatalf("stored secret %q is none of the created values", got[0])
	}

	deleted := make([]error, callers)
	start = make(chan struct{})
	for i := range callers {
		wg.Go(func() {
			<-start
			deleted[i] = replicas[i%2].DeleteSecret(ctx, "ca")
		})
	}
	close(start)
	wg.Wait()
	succeeded := 0
	for i, err := range deleted {
		switch {
		case err == nil:
			succeeded++
		case !errors.Is(err, store.ErrNotFound):
			t.Errorf("delete %d: %v", i, err)
		}
	}
	if succeeded != 1 {
		t.Errorf("%d concurrent deletes succeeded, want exactly 1", succeeded)
	}
}
