package snapshot

import (
	"cmp"
	"context"
	"io"
	"slices"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Decoders of whole-file objects carry megabytes of tables; reusing them
// keeps snapshots of many small files cheap.
var decoders sync.Pool

// getDecoder returns a synchronous decoder (concurrency 1 starts no
// goroutines, so a pooled decoder dropped by the GC leaks nothing).
func getDecoder(r io.Reader) (*zstd.Decoder, error) {
	if d, ok := decoders.Get().(*zstd.Decoder); ok {
		if err := d.Reset(r); err != nil {
			return nil, err
		}
		return d, nil
	}
	return zstd.NewReader(r,
		zstd.WithDecoderConcurrency(1),
		// Objects are hashed while they decode, so a corrupt frame header
		// is seen before its digest is; bound what it can make us allocate.
		zstd.WithDecoderMaxWindow(64<<20),
	)
}

func putDecoder(d *zstd.Decoder) {
	if d.Reset(nil) == nil {
		decoders.Put(d)
	}
}

// forEach runs fn(ctx, i) for i in order with up to workers at a time;
// the first error cancels the rest and is returned.
func forEach(ctx context.Context, workers int, order []int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range min(workers, len(order)) {
		wg.Go(func() {
			for i := range work {
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = err; cancel(err) })
				}
			}
		})
	}
feed:
	for _, i := range order {
		select {
		case work <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if first != nil {
		return first
	}
	return context.Cause(ctx)
}

// largestFirst orders file entry indexes by size, descending, so one big
// memory image does not start last and stretch the whole transfer.
func largestFirst(entries []Entry, idx []int) {
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(entries[b].Size, entries[a].Size) })
}
