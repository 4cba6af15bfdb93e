// Package testkit holds what the tests of several packages share: it is
// imported by _test.go files only.
package testkit

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer that a logger or a running command writes
// while the test reads it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
