package store

import (
	"sync"
)

// An UPDATE that names an indexed column rewrites that column's index
// entry even when the value stays the same, and so dirties an index page
// that the commit must write: a worker's node and pool, an actor's
// template, never change on a resume or suspend. Update therefore leaves
// out of its SET list the indexed columns whose value it knows to be
// unchanged, and checks them in its WHERE clause instead, so the row is
// only written when they really hold those values. If they do not, the
// update matches no row and Update runs the full statement, which sets
// every column; so a wrong guess costs one statement, never a wrong row.
//
// The guess comes from columnCache: the column values of the record
// versions this store read or wrote last. (uid, version) names one write
// of one record, so it is almost never wrong; a record deleted and created
// again under the same uid is the exception the WHERE check covers.

// columnCacheSize bounds the cache (entries, all kinds together).
const columnCacheSize = 4096

type columnCache struct {
	mu sync.Mutex
	m  map[columnKey]columnValues
}

type columnKey struct{ table, uid string }

type columnValues struct {
	version int64
	values  []string
}

func newColumnCache() *columnCache { return &columnCache{m: map[columnKey]columnValues{}} }

// put remembers values as those of version of the record.
func (c *columnCache) put(table, uid string, version int64, values []string) {
	if c == nil || len(values) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	key := columnKey{table, uid}
	if _, ok := c.m[key]; !ok && len(c.m) >= columnCacheSize {
		for k := range c.m { // any one: map order is random
			delete(c.m, k)
			break
		}
	}
	c.m[key] = columnValues{version: version, values: values}
}

// get returns the values remembered for exactly this version.
func (c *columnCache) get(table, uid string, version int64) ([]string, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[columnKey{table, uid}]
	if !ok || v.version != version {
		return nil, false
	}
	return v.values, true
}
