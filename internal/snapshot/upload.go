package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Upload stores the tree under srcDir (directories, regular files and
// symlinks) as the snapshot at location and returns its manifest, the
// manifest's digest (to keep in the snapshot record) and the bytes stored.
//
// Objects go first and the manifest last, so the snapshot is invisible to
// Download until it is complete. A location is written once: uploading to
// one that has a manifest fails with ErrExists, because that snapshot may
// already be referenced. On failure Upload tries to remove what it wrote;
// what remains has no manifest and is left to SweepOrphans.
func Upload(ctx context.Context, store ObjectStore, location, srcDir string) (*Manifest, string, int64, error) {
	// Chunks this upload names without putting them are safe from sweeps
	// only if its manifest lands within UploadDeadline (ChunkGrace).
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, UploadDeadline)
	defer cancel()
	if _, _, _, err := ParseLocation(location); err != nil {
		return nil, "", 0, err
	}
	switch rc, err := store.Get(ctx, manifestKey(location)); {
	case err == nil:
		rc.Close()
		return nil, "", 0, fmt.Errorf("upload snapshot %s: %w", location, ErrExists)
	case !errors.Is(err, ErrNotFound):
		return nil, "", 0, fmt.Errorf("upload snapshot %s: %w", location, err)
	}
	m, sources, err := scanTree(location, srcDir)
	if err != nil {
		return nil, "", 0, fmt.Errorf("upload snapshot %s: %w", location, err)
	}
	digest, size, err := uploadTree(ctx, store, start, m, sources)
	if err != nil {
		// The caller's context may be what failed; cleanup still has to
		// run. Chunks put stay for SweepChunks: others may name them.
		if derr := DeleteSnapshot(context.WithoutCancel(ctx), store, location); derr != nil {
			slog.WarnContext(ctx, "snapshot: cleanup of failed upload", "location", location, "err", derr)
		}
		return nil, "", 0, fmt.Errorf("upload snapshot %s: %w", location, err)
	}
	return m, digest, size, nil
}

func uploadTree(ctx context.Context, store ObjectStore, start time.Time, m *Manifest, sources map[int]string) (string, int64, error) {
	files := make([]int, 0, len(sources))
	for i := range sources {
		files = append(files, i)
	}
	largestFirst(m.Entries, files)
	u := newChunkUpload(ctx, store, start)
	// Files are cut one after another (cutting is sequential within a
	// file); their chunks are hashed, compressed and put in parallel.
	chunks := map[int][]*Chunk{}
	for _, i := range files {
		e := &m.Entries[i]
		var err error
		if chunks[i], err = u.file(sources[i], e); err != nil {
			u.fail(fmt.Errorf("file %s: %w", e.Path, err))
			break
		}
	}
	if err := u.wait(); err != nil {
		return "", 0, err
	}
	for i, cs := range chunks {
		e := &m.Entries[i]
		e.Chunks = make([]Chunk, len(cs))
		for k, c := range cs {
			e.Chunks[k] = *c
		}
	}
	body, err := json.Marshal(m)
	if err != nil {
		return "", 0, fmt.Errorf("encode manifest: %w", err)
	}
	if err := store.Put(ctx, manifestKey(m.Location), bytes.NewReader(body)); err != nil {
		return "", 0, fmt.Errorf("manifest: %w", err)
	}
	// A put may finish after the context ended; a manifest that late may
	// name chunks a sweep has deleted.
	if took := time.Since(start); took > UploadDeadline {
		return "", 0, fmt.Errorf("manifest written after the upload deadline (%s > %s)", took, UploadDeadline)
	}
	return digestOf(body), m.StoredSize() + int64(len(body)), nil
}

// chunkUpload puts the chunks of one snapshot: up to transferWorkers at
// a time, each chunk of a content once, none the store is known to hold.
type chunkUpload struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	store  ObjectStore
	known  *knownChunks
	start  time.Time
	slots  chan struct{}
	wg     sync.WaitGroup

	mu       sync.Mutex
	inflight map[string]*chunkPut
	err      error
}

// chunkPut is one content's chunk being put; others with the same
// content wait for it.
type chunkPut struct {
	done  chan struct{}
	chunk Chunk
	err   error
}

func newChunkUpload(ctx context.Context, store ObjectStore, start time.Time) *chunkUpload {
	ctx, cancel := context.WithCancelCause(ctx)
	return &chunkUpload{
		ctx: ctx, cancel: cancel, store: store, known: knownIn(store), start: start,
		slots: make(chan struct{}, transferWorkers()), inflight: map[string]*chunkPut{},
	}
}

func (u *chunkUpload) fail(err error) {
	u.mu.Lock()
	if u.err == nil {
		u.err = err
		u.cancel(err)
	}
	u.mu.Unlock()
}

// wait returns once every chunk is stored or the upload failed.
func (u *chunkUpload) wait() error {
	u.wg.Wait()
	defer u.cancel(nil)
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.err != nil {
		return u.err
	}
	return u.ctx.Err()
}

// file cuts src into chunks and starts storing each; the chunks are
// filled in once wait returns nil.
func (u *chunkUpload) file(src string, e *Entry) ([]*Chunk, error) {
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	scan := scanBuffers.Get().(*[]byte)
	defer scanBuffers.Put(scan)
	c, err := newChunker(f, *scan)
	if err != nil {
		return nil, err
	}
	var chunks []*Chunk
	e.Size = 0 // the bytes actually read
	for {
		// A slot bounds the chunk buffers in use, not just the puts.
		select {
		case u.slots <- struct{}{}:
		case <-u.ctx.Done():
			return nil, context.Cause(u.ctx)
		}
		// The last chunk comes with io.EOF, or io.EOF comes after it.
		piece, err := c.Next()
		switch {
		case err != nil && err != io.EOF:
			<-u.slots
			return nil, err
		case len(piece) == 0:
			<-u.slots
			return chunks, nil
		}
		// piece is in the scan buffer, which the next cut reuses.
		buf := chunkBuffers.Get().(*[]byte)
		data := append((*buf)[:0], piece...)
		e.Size += int64(len(data))
		out := &Chunk{}
		chunks = append(chunks, out)
		u.wg.Go(func() {
			defer func() { chunkBuffers.Put(buf); <-u.slots }()
			if err := u.put(data, out); err != nil {
				u.fail(fmt.Errorf("file %s: %w", e.Path, err))
			}
		})
		if err == io.EOF {
			return chunks, nil
		}
	}
}

// put makes sure the store holds a chunk of data and describes it in out.
func (u *chunkUpload) put(data []byte, out *Chunk) error {
	sha := chunkSHA256(data)
	if c, ok := u.known.reusable(sha, u.start); ok {
		*out = c
		return nil
	}
	u.mu.Lock()
	p, waiting := u.inflight[sha]
	if !waiting {
		p = &chunkPut{done: make(chan struct{})}
		u.inflight[sha] = p
	}
	u.mu.Unlock()
	if waiting {
		select {
		case <-p.done:
		case <-u.ctx.Done():
			return context.Cause(u.ctx)
		}
		*out = p.chunk
		return p.err
	}
	defer close(p.done)
	c := Chunk{SHA256: sha, Size: int64(len(data)), Written: time.Now().Unix()}
	buf := chunkBuffers.Get().(*[]byte)
	defer chunkBuffers.Put(buf)
	stored := chunkEncoder().EncodeAll(data, (*buf)[:0])
	c.StoredSize = int64(len(stored))
	if err := u.store.Put(u.ctx, c.Key(), bytes.NewReader(stored)); err != nil {
		p.err = fmt.Errorf("chunk %s: %w", sha, err)
		return p.err
	}
	u.known.add(c)
	p.chunk, *out = c, c
	return nil
}

// scanTree lists srcDir into a manifest with file digests still empty, and
// the source path of each file entry by index.
func scanTree(location, srcDir string) (*Manifest, map[int]string, error) {
	root, err := filepath.EvalSymlinks(srcDir)
	if err != nil {
		return nil, nil, fmt.Errorf("source directory: %w", err)
	}
	m := &Manifest{Version: manifestChunked, Location: location, Compression: compressionZstd}
	sources := map[int]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no unix file attributes", rel)
		}
		e := Entry{
			Path:    rel,
			Mode:    st.Mode & 0o7777,
			UID:     int(st.Uid),
			GID:     int(st.Gid),
			ModTime: fi.ModTime().UTC(),
		}
		switch {
		case fi.IsDir():
			e.Type = EntryDir
		case fi.Mode().IsRegular():
			e.Type = EntryFile
			e.Size = fi.Size() // replaced by the bytes actually read
			sources[len(m.Entries)] = path
		case fi.Mode()&fs.ModeSymlink != 0:
			e.Type = EntrySymlink
			if e.Target, err = os.Readlink(path); err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
		default:
			return fmt.Errorf("%s: unsupported file type %s (only directories, regular files and symlinks)", rel, fi.Mode().Type())
		}
		m.Entries = append(m.Entries, e)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("source directory %s: %w", srcDir, err)
	}
	if m.Entries[0].Type != EntryDir {
		return nil, nil, fmt.Errorf("source directory %s: not a directory", srcDir)
	}
	return m, sources, nil
}

// countingHash is a sha256 that also counts what it was fed.
type countingHash struct {
	h hash.Hash
	n int64
}

func newCountingHash() *countingHash { return &countingHash{h: sha256.New()} }

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.h.Write(p)
}

func (c *countingHash) sum() string { return hex.EncodeToString(c.h.Sum(nil)) }
