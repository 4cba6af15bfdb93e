package snapshot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/klauspost/compress/zstd"
)

// uploadWholeFiles writes the tree at srcDir as a version 1 snapshot, one
// zstd object per file, as Upload did before chunks: what older stores
// hold (Download must keep reading it) and the baseline of the
// benchmarks.
func uploadWholeFiles(ctx context.Context, store ObjectStore, location, srcDir string) (*Manifest, string, int64, error) {
	m, sources, err := scanTree(location, srcDir)
	if err != nil {
		return nil, "", 0, err
	}
	m.Version = manifestWholeFiles
	n := 0
	for i := range m.Entries {
		if _, ok := sources[i]; ok {
			m.Entries[i].Object = fmt.Sprintf("files/%d.zst", n)
			n++
		}
	}
	files := make([]int, 0, len(sources))
	for i := range sources {
		files = append(files, i)
	}
	largestFirst(m.Entries, files)
	err = forEach(ctx, runtime.GOMAXPROCS(0), files, func(ctx context.Context, i int) error {
		e := &m.Entries[i]
		return uploadWholeFile(ctx, store, location+"/"+e.Object, sources[i], e)
	})
	if err != nil {
		return nil, "", 0, err
	}
	body, err := json.Marshal(m)
	if err != nil {
		return nil, "", 0, err
	}
	if err := store.Put(ctx, manifestKey(location), bytes.NewReader(body)); err != nil {
		return nil, "", 0, err
	}
	return m, digestOf(body), m.StoredSize() + int64(len(body)), nil
}

func uploadWholeFile(ctx context.Context, store ObjectStore, key, src string, e *Entry) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	raw, stored := newCountingHash(), newCountingHash()
	pr, pw := io.Pipe()
	encoded := make(chan error, 1)
	go func() {
		enc, err := zstd.NewWriter(io.MultiWriter(pw, stored),
			zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)),
			zstd.WithConcurrentBlocks(true),
			zstd.WithWindowSize(1<<20),
		)
		if err == nil {
			_, err = enc.ReadFrom(io.TeeReader(f, raw))
			if cerr := enc.Close(); err == nil {
				err = cerr
			}
		}
		pw.CloseWithError(err)
		encoded <- err
	}()
	putErr := store.Put(ctx, key, pr)
	pr.CloseWithError(errors.New("object store stopped reading"))
	if encErr := <-encoded; encErr != nil && putErr == nil {
		return encErr
	}
	if putErr != nil {
		return putErr
	}
	e.Size, e.SHA256 = raw.n, raw.sum()
	e.ObjectSize, e.ObjectSHA256 = stored.n, stored.sum()
	return nil
}
