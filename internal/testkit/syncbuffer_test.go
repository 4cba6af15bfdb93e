package testkit

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestSyncBufferKeepsEveryConcurrentWrite(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	const writers, lines = 8, 100
	for w := range writers {
		wg.Go(func() {
			for i := range lines {
				fmt.Fprintf(&b, "%d-%d\n", w, i)
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "\n"); got != writers*lines {
		t.Fatalf("%d lines, want %d", got, writers*lines)
	}
}
