package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// waitFor polls cond: for synchronising with goroutines, not for timing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (c *Cache) waitersFor(location, digest string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.loading[cacheKey{location, digest}]; l != nil {
		return l.waiters
	}
	return 0
}

// cacheFixture is a store holding snapshots of 1000 bytes each.
type cacheFixture struct {
	store   *recordingStore
	digests map[string]string
}

const fixtureFileSize = 1000

func newCacheFixture(t *testing.T, locations ...string) *cacheFixture {
	t.Helper()
	base := newDirStore(t)
	f := &cacheFixture{store: &recordingStore{ObjectStore: base}, digests: map[string]string{}}
	for _, loc := range locations {
		_, f.digests[loc] = mustUpload(t, base, loc, simpleTree(strings.Repeat(loc[len(loc)-1:], fixtureFileSize)))
	}
	return f
}

func newTestCache(t *testing.T, maxBytes int64, store ObjectStore) *Cache {
	t.Helper()
	c, err := NewCache(t.TempDir(), maxBytes, store)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *cacheFixture) get(t *testing.T, c *Cache, loc string) (string, Release) {
	t.Helper()
	dir, release, err := c.Get(t.Context(), loc, f.digests[loc])
	if err != nil {
		t.Fatalf("Get %s: %v", loc, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "pages.img"))
	if err != nil || string(b) != strings.Repeat(loc[len(loc)-1:], fixtureFileSize) {
		t.Fatalf("Get %s: cached content wrong: %v", loc, err)
	}
	return dir, release
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func TestCacheSingleDownloadUnderConcurrency(t *testing.T) {
	const loc, callers = "default/a/s1", 16
	f := newCacheFixture(t, loc)
	gate := make(chan struct{})
	f.store.gate = gate
	c := newTestCache(t, 1<<20, f.store)

	dirs := make(chan string, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			dir, release, err := c.Get(context.Background(), loc, f.digests[loc])
			if err != nil {
				t.Error(err)
				return
			}
			defer release(false)
			dirs <- dir
		})
	}
	waitFor(t, "all callers to wait on one download", func() bool { return c.waitersFor(loc, f.digests[loc]) == callers })
	close(gate)
	wg.Wait()
	close(dirs)
	first := <-dirs
	for d := range dirs {
		if d != first {
			t.Errorf("callers got different directories: %s and %s", first, d)
		}
	}
	if n := f.store.manifestGets(); n != 1 {
		t.Errorf("%d downloads for %d concurrent callers, want 1", n, callers)
	}
	_, release := f.get(t, c, loc)
	release(false)
	if n := f.store.manifestGets(); n != 1 {
		t.Errorf("a hit downloaded again: %d downloads", n)
	}
}

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	f := newCacheFixture(t, "default/a/A", "default/a/B", "default/a/C")
	c := newTestCache(t, 2*fixtureFileSize+500, f.store)
	dirs := map[string]string{}
	for _, loc := range []string{"default/a/A", "default/a/B", "default/a/A", "default/a/C"} {
		dir, release := f.get(t, c, loc)
		release(false)
		dirs[loc] = dir
	}
	// The download that evicts removes the victim after handing out its
	// own entry.
	waitFor(t, "B, the least recently used, to be evicted", func() bool { return !exists(dirs["default/a/B"]) })
	for _, loc := range []string{"default/a/A", "default/a/C"} {
		if !exists(dirs[loc]) {
			t.Errorf("%s was evicted; it was used more recently than B", loc)
		}
	}
	if got := c.Bytes(); got != 2*fixtureFileSize {
		t.Errorf("Bytes() = %d, want %d", got, 2*fixtureFileSize)
	}
	before := f.store.manifestGets()
	_, release := f.get(t, c, "default/a/A")
	release(false)
	if f.store.manifestGets() != before {
		t.Error("A was downloaded again though cached")
	}
	_, release = f.get(t, c, "default/a/B")
	release(false)
	if f.store.manifestGets() != before+1 {
		t.Error("evicted B was not downloaded again")
	}
}

func TestCacheKeepsEntriesInUse(t *testing.T) {
	f := newCacheFixture(t, "default/a/A", "default/a/B")
	c := newTestCache(t, fixtureFileSize+500, f.store)
	dirA, releaseA := f.get(t, c, "default/a/A")
	dirB, releaseB := f.get(t, c, "default/a/B")
	if !exists(dirA) || !exists(dirB) {
		t.Fatal("an entry in use was evicted")
	}
	if got := c.Bytes(); got != 2*fixtureFileSize {
		t.Errorf("Bytes() with two entries in use = %d, want %d", got, 2*fixtureFileSize)
	}
	releaseA(false)
	releaseA(false) // idempotent: must not drop B's or a later reference
	if exists(dirA) {
		t.Error("A, released and over the bound, was not evicted")
	}
	if !exists(dirB) {
		t.Error("B, still in use, was evicted")
	}
	releaseB(false)
	if !exists(dirB) {
		t.Error("B, within the bound, was evicted on release")
	}

	small := newTestCache(t, fixtureFileSize/2, f.store)
	dir, release := f.get(t, small, "default/a/A")
	if !exists(dir) {
		t.Fatal("an entry larger than the bound was not served")
	}
	release(false)
	if exists(dir) {
		t.Error("an entry larger than the bound stayed after release")
	}
}

func TestCacheAdd(t *testing.T) {
	const loc = "default/a/s1"
	f := newCacheFixture(t)
	cacheDir := t.TempDir()
	c, err := NewCache(cacheDir, 1<<20, f.store)
	if err != nil {
		t.Fatal(err)
	}
	produced := filepath.Join(cacheDir, "checkpoint-out")
	if err := os.Mkdir(produced, 0o700); err != nil {
		t.Fatal(err)
	}
	writeTree(t, produced, simpleTree("just checkpointed"))
	const digest = "sha256:0000000000000000000000000000000000000000000000000000000000000001"
	if err := c.Add(loc, digest, produced); err != nil {
		t.Fatal(err)
	}
	if exists(produced) {
		t.Error("Add left the source directory in place")
	}
	dir, release, err := c.Get(t.Context(), loc, digest)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "pages.img")); err != nil || string(b) != "just checkpointed" {
		t.Errorf("cached content = %q, %v", b, err)
	}
	if n := f.store.manifestGets(); n != 0 {
		t.Errorf("Get after Add went to the store %d times", n)
	}

	again := filepath.Join(cacheDir, "again")
	if err := os.Mkdir(again, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(loc, digest, again); err != nil {
		t.Fatal(err)
	}
	if exists(again) {
		t.Error("a duplicate Add left its directory behind")
	}
	if got := c.Bytes(); got != int64(len("just checkpointed")) {
		t.Errorf("Bytes() after duplicate Add = %d", got)
	}
	release(false)

	// Restored (spent), the checkpoint's tree goes.
	dir, release, err = c.Get(t.Context(), loc, digest)
	if err != nil {
		t.Fatal(err)
	}
	release(true)
	if exists(dir) || c.Bytes() != 0 {
		t.Errorf("a checkpoint's tree spent by a restore stayed (Bytes() = %d)", c.Bytes())
	}
}

// TestCacheAddSupersedesOlderTrees: a node's new checkpoint of an actor
// drops the unused trees of that actor's older snapshots, keeps one in use
// and leaves other actors' trees alone.
func TestCacheAddSupersedesOlderTrees(t *testing.T) {
	f := newCacheFixture(t, "default/a/s1", "default/a/s2", "default/b/s1")
	c := newTestCache(t, 1<<20, f.store)
	older, releaseOlder := f.get(t, c, "default/a/s1")
	releaseOlder(false)
	inUse, releaseInUse := f.get(t, c, "default/a/s2")
	other, releaseOther := f.get(t, c, "default/b/s1")
	releaseOther(false)

	produced := filepath.Join(c.dir, "checkpoint-out")
	if err := os.Mkdir(produced, 0o700); err != nil {
		t.Fatal(err)
	}
	writeTree(t, produced, simpleTree("newest"))
	if err := c.Add("default/a/s3", "sha256:0000000000000000000000000000000000000000000000000000000000000003", produced); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		dir  string
		want bool
	}{
		{"older unused tree of the actor", older, false},
		{"older tree of the actor in use", inUse, true},
		{"another actor's tree", other, true},
	} {
		if exists(tc.dir) != tc.want {
			t.Errorf("%s: exists = %v, want %v", tc.name, !tc.want, tc.want)
		}
	}
	releaseInUse(false)
	if want := int64(2*fixtureFileSize + len("newest")); c.Bytes() != want {
		t.Errorf("Bytes() = %d, want %d (a/s2, b/s1 and a/s3)", c.Bytes(), want)
	}
}

// TestCacheForget: forgetting a location removes its unused tree at once,
// leaves a tree in use to the bound, and touches no other location.
func TestCacheForget(t *testing.T) {
	f := newCacheFixture(t, "default/a/s1", "default/a/s2", "default/b/s1")
	c := newTestCache(t, 1<<20, f.store)
	forgotten, release := f.get(t, c, "default/a/s1")
	release(false)
	inUse, releaseInUse := f.get(t, c, "default/a/s2")
	other, releaseOther := f.get(t, c, "default/b/s1")
	releaseOther(false)

	c.Forget("default/a/s1")
	c.Forget("default/a/s2")
	for _, tc := range []struct {
		name string
		dir  string
		want bool
	}{
		{"the forgotten unused tree", forgotten, false},
		{"a forgotten tree in use", inUse, true},
		{"another location's tree", other, true},
	} {
		if exists(tc.dir) != tc.want {
			t.Errorf("%s: exists = %v, want %v", tc.name, !tc.want, tc.want)
		}
	}
	releaseInUse(false)
	before := f.store.manifestGets()
	_, release = f.get(t, c, "default/a/s1")
	release(false)
	if f.store.manifestGets() != before+1 {
		t.Errorf("a Get of the forgotten location did not download it again")
	}
}

func TestCacheDoesNotKeepCorruptSnapshots(t *testing.T) {
	const loc = "default/a/s1"
	f := newCacheFixture(t, loc)
	cacheDir := t.TempDir()
	c, err := NewCache(cacheDir, 1<<20, f.store)
	if err != nil {
		t.Fatal(err)
	}
	wrong := digestOf([]byte("not the manifest"))
	for range 2 {
		if _, _, err := c.Get(t.Context(), loc, wrong); !errors.Is(err, ErrDataLoss) {
			t.Fatalf("Get with a wrong digest = %v, want ErrDataLoss", err)
		}
	}
	if n := f.store.manifestGets(); n != 2 {
		t.Errorf("failed download was cached: %d downloads for 2 Gets", n)
	}
	if names, _ := os.ReadDir(cacheDir); len(names) != 0 {
		t.Errorf("failed downloads left %v in the cache", names)
	}
	if c.Bytes() != 0 {
		t.Errorf("Bytes() = %d after failures", c.Bytes())
	}
}

func TestCacheCancelledWaiters(t *testing.T) {
	const loc = "default/a/s1"
	f := newCacheFixture(t, loc)
	digest := f.digests[loc]
	gate := make(chan struct{})
	f.store.gate = gate
	cacheDir := t.TempDir()
	c, err := NewCache(cacheDir, 1<<20, f.store)
	if err != nil {
		t.Fatal(err)
	}

	// A caller giving up does not cancel a download others wait for.
	ctx1, cancel1 := context.WithCancel(t.Context())
	done1 := make(chan error, 1)
	go func() {
		_, _, err := c.Get(ctx1, loc, digest)
		done1 <- err
	}()
	done2 := make(chan error, 1)
	go func() {
		_, release, err := c.Get(context.Background(), loc, digest)
		if err == nil {
			release(false)
		}
		done2 <- err
	}()
	waitFor(t, "two waiters", func() bool { return c.waitersFor(loc, digest) == 2 })
	cancel1()
	if err := <-done1; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Get = %v, want context.Canceled", err)
	}
	close(gate)
	if err := <-done2; err != nil {
		t.Errorf("remaining waiter: %v", err)
	}

	// The last caller giving up cancels the download.
	f.store.mu.Lock()
	f.store.gate = make(chan struct{})
	f.store.mu.Unlock()
	const other = "default/a/s2"
	_, otherDigest := mustUpload(t, f.store.ObjectStore, other, simpleTree("two"))
	ctx3, cancel3 := context.WithCancel(t.Context())
	done3 := make(chan error, 1)
	go func() {
		_, _, err := c.Get(ctx3, other, otherDigest)
		done3 <- err
	}()
	waitFor(t, "one waiter", func() bool { return c.waitersFor(other, otherDigest) == 1 })
	cancel3()
	if err := <-done3; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Get = %v, want context.Canceled", err)
	}
	waitFor(t, "the abandoned download to stop and clean up", func() bool {
		names, _ := os.ReadDir(cacheDir)
		return len(names) == 1 // the first snapshot's entry only
	})
	if _, release, err := c.Get(t.Context(), loc, digest); err != nil {
		t.Errorf("cached entry lost: %v", err)
	} else {
		release(false)
	}
}

func TestNewCacheClearsOnlyItsOwnLeftovers(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"snap-0123456789abcdef-1", ".snap-0123456789abcdef-2.partial-99", "unrelated"} {
		if err := os.MkdirAll(filepath.Join(dir, d, "x"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewCache(dir, 1, newDirStore(t)); err != nil {
		t.Fatal(err)
	}
	names, _ := os.ReadDir(dir)
	if len(names) != 1 || names[0].Name() != "unrelated" {
		t.Errorf("after NewCache the directory holds %v, want only 'unrelated'", names)
	}
	if _, err := NewCache(dir, 0, newDirStore(t)); err == nil {
		t.Error("NewCache accepted a zero size bound")
	}
}

// TestCacheServesSeveralStores: one cache, under one bound, holds the
// snapshots of two stores (a node's snapshot storage and its local
// checkpoints), each downloaded from the store it was asked of.
func TestCacheServesSeveralStores(t *testing.T) {
	storage := newCacheFixture(t, "default/a/A")
	local := newCacheFixture(t, "default/a/L")
	c := newTestCache(t, fixtureFileSize+500, storage.store)
	dirA, release := storage.get(t, c, "default/a/A")
	release(false)
	dirL, release, err := c.GetFrom(t.Context(), local.store, "default/a/L", local.digests["default/a/L"])
	if err != nil {
		t.Fatal(err)
	}
	release(false)
	if b, err := os.ReadFile(filepath.Join(dirL, "pages.img")); err != nil || string(b) != strings.Repeat("L", fixtureFileSize) {
		t.Fatalf("the local checkpoint's cached content is wrong: %v", err)
	}
	if storage.store.manifestGets() != 1 || local.store.manifestGets() != 1 {
		t.Errorf("downloads: %d from storage, %d from local, want one each", storage.store.manifestGets(), local.store.manifestGets())
	}
	// The bound holds one tree: L's download evicted A, whose store is
	// another.
	waitFor(t, "A to be evicted by L", func() bool { return !exists(dirA) })
	if got := c.Bytes(); got != fixtureFileSize {
		t.Errorf("Bytes() = %d, want one tree, %d", got, fixtureFileSize)
	}
}

// TestCacheDropsSpentTrees: a tree whose uses all spent it goes when the
// last is released, within the bound or not; a use released not spent (a
// restore that failed, whose retry needs the tree) keeps it, whatever the
// order of the releases. The verdict is per period of use.
func TestCacheDropsSpentTrees(t *testing.T) {
	const loc = "default/a/A"
	tests := []struct {
		name string
		// spent: how each of the concurrent uses is released, in order.
		spent []bool
		kept  bool
	}{
		{"not spent", []bool{false}, true},
		{"spent", []bool{true}, false},
		{"all uses spent", []bool{true, true}, false},
		{"spent, then one not", []bool{true, false}, true},
		{"not spent, then spent", []bool{false, true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCacheFixture(t, loc)
			c := newTestCache(t, 1<<20, f.store)
			var dir string
			var releases []Release
			for range tt.spent {
				d, release := f.get(t, c, loc)
				dir, releases = d, append(releases, release)
			}
			for i, spent := range tt.spent {
				releases[i](spent)
				if i < len(releases)-1 && !exists(dir) {
					t.Fatalf("the tree was removed after release %d while still in use", i)
				}
			}
			if exists(dir) != tt.kept {
				t.Fatalf("tree kept = %v, want %v", exists(dir), tt.kept)
			}
			if want := map[bool]int64{true: fixtureFileSize}[tt.kept]; c.Bytes() != want {
				t.Errorf("Bytes() = %d, want %d", c.Bytes(), want)
			}
			before := f.store.manifestGets()
			_, release := f.get(t, c, loc)
			if downloaded := f.store.manifestGets() > before; downloaded == tt.kept {
				t.Errorf("the next Get downloaded = %v, with the tree kept = %v", downloaded, tt.kept)
			}
			// A new period of use: spent alone, it drops the tree.
			release(true)
			if exists(dir) || c.Bytes() != 0 {
				t.Errorf("a tree spent by its only use stayed (Bytes() = %d)", c.Bytes())
			}
		})
	}
}

// TestCacheSpentUnderConcurrency: uses of one tree that come and go,
// spent or not, while others Get it: a tree in use is never removed, a
// Get of a tree being dropped gets a complete one, and the bytes counted
// are the trees on disk. Run with -race.
func TestCacheSpentUnderConcurrency(t *testing.T) {
	const loc, users, rounds = "default/a/A", 8, 50
	f := newCacheFixture(t, loc)
	cacheDir := t.TempDir()
	c, err := NewCache(cacheDir, 1<<20, f.store)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for u := range users {
		wg.Go(func() {
			for r := range rounds {
				dir, release, err := c.Get(t.Context(), loc, f.digests[loc])
				if err != nil {
					t.Error(err)
					return
				}
				b, err := os.ReadFile(filepath.Join(dir, "pages.img"))
				if err != nil || len(b) != fixtureFileSize {
					t.Errorf("a tree in use: %d bytes, %v", len(b), err)
				}
				release((u+r)%3 != 0)
			}
		})
	}
	wg.Wait()
	names, err := os.ReadDir(cacheDir)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(names))*fixtureFileSize != c.Bytes() {
		t.Errorf("%d trees on disk, Bytes() = %d", len(names), c.Bytes())
	}
	if n := f.store.manifestGets(); n < 2 {
		t.Errorf("%d downloads: spent trees were never dropped", n)
	}
}
