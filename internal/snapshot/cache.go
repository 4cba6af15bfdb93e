package snapshot

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
)

// entryPrefix marks the cache's own directories (downloads in progress are
// ".snap-…"), so startup clears only what the cache made.
const entryPrefix = "snap-"

// Cache keeps verified snapshot trees on local disk so a node restores
// recently used snapshots without fetching them again. It holds at most
// maxBytes of unused entries, evicting the least recently used; entries
// handed out by Get stay until released, even over the bound. A tree
// whose uses all spent it (see Release) goes when the last is released,
// whatever the bound.
type Cache struct {
	store    ObjectStore
	dir      string
	maxBytes int64

	mu      sync.Mutex
	entries map[cacheKey]*cacheEntry
	lru     *list.List // of *cacheEntry, most recently used at the front
	bytes   int64
	loading map[cacheKey]*cacheLoad
	seq     int
}

// A record names a snapshot by location and manifest digest; the digest
// is in the key so a changed snapshot is never served from a stale entry.
type cacheKey struct{ location, digest string }

type cacheEntry struct {
	key  cacheKey
	dir  string
	size int64
	refs int
	elem *list.Element
	// Since the entry was last unused: whether a use was released spent,
	// and whether one was released not spent.
	spent, kept bool
}

// A Release ends one use of a tree handed out by Get; calls after the
// first do nothing. spent says the use consumed the snapshot: a restore
// started from it, and whatever comes next starts from a newer one. The
// tree is then dropped as soon as nobody uses it, unless another use
// since it was last unused was released not spent (a restore that
// failed: its retry needs the tree).
type Release func(spent bool)

// cacheLoad is one download shared by every Get of its key.
type cacheLoad struct {
	done    chan struct{}
	waiters int
	cancel  context.CancelFunc
	// Set before done closes: the entry (with one reference taken for
	// each waiter counted then) or the error.
	entry *cacheEntry
	err   error
}

// NewCache makes a cache in dir backed by store. Entries left by a
// previous process are removed: they were not fsynced, so after a crash
// they cannot be trusted.
func NewCache(dir string, maxBytes int64, store ObjectStore) (*Cache, error) {
	if maxBytes <= 0 {
		return nil, fmt.Errorf("snapshot cache %s: size bound %d must be positive", dir, maxBytes)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot cache: %w", err)
	}
	names, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot cache: %w", err)
	}
	for _, n := range names {
		if strings.HasPrefix(strings.TrimPrefix(n.Name(), "."), entryPrefix) {
			if err := os.RemoveAll(filepath.Join(dir, n.Name())); err != nil {
				return nil, fmt.Errorf("snapshot cache: clear old entry: %w", err)
			}
		}
	}
	return &Cache{
		store:    store,
		dir:      dir,
		maxBytes: maxBytes,
		entries:  map[cacheKey]*cacheEntry{},
		lru:      list.New(),
		loading:  map[cacheKey]*cacheLoad{},
	}, nil
}

// Get returns a directory holding the verified snapshot, downloading it on
// a miss (once, however many callers ask at the same time). The directory
// stays until release is called; callers must not modify it. A download
// continues while any caller still waits for it. A Get of a tree being
// dropped downloads it again into a directory of its own.
func (c *Cache) Get(ctx context.Context, location, digest string) (dir string, release Release, err error) {
	return c.GetFrom(ctx, c.store, location, digest)
}

// GetFrom is Get of a snapshot of another store than the cache's own, so
// one cache, under one bound, serves every store a node restores from. A
// tree is verified against its manifest digest, which is part of the key:
// an entry is the same content whichever store filled it.
func (c *Cache) GetFrom(ctx context.Context, store ObjectStore, location, digest string) (dir string, release Release, err error) {
	k := cacheKey{location, digest}
	c.mu.Lock()
	if e := c.entries[k]; e != nil {
		e.refs++
		c.lru.MoveToFront(e.elem)
		c.mu.Unlock()
		return e.dir, c.releaser(e), nil
	}
	l := c.loading[k]
	if l == nil {
		// The download outlives the first caller's context: others may
		// be waiting for it too. It is cancelled when nobody waits.
		lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		l = &cacheLoad{done: make(chan struct{}), cancel: cancel}
		c.loading[k] = l
		go c.load(lctx, store, k, l, c.newEntryDirLocked(k))
	}
	l.waiters++
	c.mu.Unlock()

	select {
	case <-l.done:
		if l.err != nil {
			return "", nil, l.err
		}
		return l.entry.dir, c.releaser(l.entry), nil
	case <-ctx.Done():
		c.mu.Lock()
		l.waiters--
		var victims []string
		switch {
		case l.entry != nil:
			// Finished as we gave up; our reference was taken for us.
			// Not spent: whoever gave up may try again.
			victims = c.unrefLocked(l.entry, false)
		case l.err == nil && l.waiters == 0:
			l.cancel()
			if c.loading[k] == l {
				delete(c.loading, k)
			}
		}
		c.mu.Unlock()
		removeAll(victims)
		return "", nil, fmt.Errorf("snapshot %s: %w", location, context.Cause(ctx))
	}
}

func (c *Cache) load(ctx context.Context, store ObjectStore, k cacheKey, l *cacheLoad, dir string) {
	defer l.cancel()
	err := Download(ctx, store, k.location, k.digest, dir)
	var size int64
	if err == nil {
		if size, err = treeSize(dir); err != nil {
			os.RemoveAll(dir)
			err = fmt.Errorf("snapshot cache: %w", err)
		}
	}
	c.mu.Lock()
	if c.loading[k] == l {
		delete(c.loading, k)
	}
	var victims []string
	if err != nil {
		l.err = err
	} else {
		l.entry, victims = c.insertLocked(k, dir, size, l.waiters)
	}
	close(l.done)
	c.mu.Unlock()
	removeAll(victims)
}

// Add moves dir, a snapshot tree this node just produced and uploaded as
// location with the given manifest digest, into the cache, so restoring it
// here needs no download. dir must be on the cache's filesystem; the cache
// owns it afterwards (it is removed if the key is already cached).
//
// The new tree supersedes the unused trees of the other snapshots in its
// location's directory (the same actor's, or template revision's, older
// snapshots): their owner's next restore is of this one, and one asked for
// by name downloads again. Without this, a node an actor keeps leaving
// holds one uncompressed tree per suspend until the size bound.
func (c *Cache) Add(location, digest, dir string) error {
	size, err := treeSize(dir)
	if err != nil {
		return fmt.Errorf("snapshot cache: add %s: %w", location, err)
	}
	k := cacheKey{location, digest}
	c.mu.Lock()
	dest := c.newEntryDirLocked(k)
	c.mu.Unlock()
	if err := os.Rename(dir, dest); err != nil {
		return fmt.Errorf("snapshot cache: add %s: %w", location, err)
	}
	c.mu.Lock()
	victims := c.supersededLocked(k)
	_, evicted := c.insertLocked(k, dest, size, 0)
	c.mu.Unlock()
	removeAll(append(victims, evicted...))
	return nil
}

// supersededLocked forgets the unused entries of other snapshots in k's
// location's directory and returns their directories, to remove once
// unlocked.
func (c *Cache) supersededLocked(k cacheKey) []string {
	parent := path.Dir(k.location)
	return c.forgetUnusedLocked(func(location string) bool {
		return location != k.location && path.Dir(location) == parent
	})
}

// Forget removes the unused trees of location, a snapshot whose record is
// gone: nothing restores it here again.
func (c *Cache) Forget(location string) {
	c.mu.Lock()
	victims := c.forgetUnusedLocked(func(l string) bool { return l == location })
	c.mu.Unlock()
	removeAll(victims)
}

// forgetUnusedLocked forgets the unused entries whose location matches and
// returns their directories, to remove once unlocked. Entries in use stay
// until the LRU bound takes them.
func (c *Cache) forgetUnusedLocked(matches func(location string) bool) []string {
	var victims []string
	for key, e := range c.entries {
		if e.refs == 0 && matches(key.location) {
			c.removeLocked(e)
			victims = append(victims, e.dir)
		}
	}
	return victims
}

// Bytes is the disk space the cached trees take, in use or not.
func (c *Cache) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// newEntryDirLocked names a fresh directory for k. Names are unique per
// fill, so a cancelled download still running never collides with its
// replacement.
func (c *Cache) newEntryDirLocked(k cacheKey) string {
	c.seq++
	sum := sha256.Sum256([]byte(k.location + "\n" + k.digest))
	return filepath.Join(c.dir, fmt.Sprintf("%s%s-%d", entryPrefix, hex.EncodeToString(sum[:8]), c.seq))
}

// insertLocked adds a filled directory with refs references taken and
// returns the entry and the directories to remove once unlocked.
func (c *Cache) insertLocked(k cacheKey, dir string, size int64, refs int) (*cacheEntry, []string) {
	if e := c.entries[k]; e != nil {
		// Filled twice (Add during a download): keep the first.
		e.refs += refs
		c.lru.MoveToFront(e.elem)
		return e, []string{dir}
	}
	e := &cacheEntry{key: k, dir: dir, size: size, refs: refs}
	e.elem = c.lru.PushFront(e)
	c.entries[k] = e
	c.bytes += size
	return e, c.evictLocked()
}

func (c *Cache) releaser(e *cacheEntry) Release {
	var once sync.Once
	return func(spent bool) {
		once.Do(func() {
			c.mu.Lock()
			victims := c.unrefLocked(e, spent)
			c.mu.Unlock()
			removeAll(victims)
		})
	}
}

// unrefLocked ends a use of e and returns the directories to remove once
// unlocked: e's own if every use since it was last unused spent it (it
// leaves the map now, so a Get from here on downloads afresh), else any
// eviction that e becoming unused allows.
func (c *Cache) unrefLocked(e *cacheEntry, spent bool) []string {
	e.refs--
	if spent {
		e.spent = true
	} else {
		e.kept = true
	}
	if e.refs > 0 {
		return nil
	}
	drop := e.spent && !e.kept
	e.spent, e.kept = false, false
	if drop {
		c.removeLocked(e)
		return []string{e.dir}
	}
	return c.evictLocked()
}

// evictLocked drops unused entries, least recently used first, until the
// cache is within its bound or only entries in use remain.
func (c *Cache) evictLocked() []string {
	var victims []string
	for el := c.lru.Back(); el != nil && c.bytes > c.maxBytes; {
		e := el.Value.(*cacheEntry)
		el = el.Prev()
		if e.refs > 0 {
			continue
		}
		c.removeLocked(e)
		victims = append(victims, e.dir)
	}
	return victims
}

// removeLocked forgets e; its directory is the caller's to remove.
func (c *Cache) removeLocked(e *cacheEntry) {
	c.lru.Remove(e.elem)
	delete(c.entries, e.key)
	c.bytes -= e.size
}

func removeAll(dirs []string) {
	for _, d := range dirs {
		os.RemoveAll(d)
	}
}

func treeSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		n += fi.Size()
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", dir, err)
	}
	return n, nil
}
