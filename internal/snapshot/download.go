package snapshot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/fstree"
)

// ReadManifest fetches the manifest of the snapshot at location and checks
// it against the digest the snapshot record carries. A missing, changed
// or malformed manifest is an ErrDataLoss.
func ReadManifest(ctx context.Context, store ObjectStore, location, manifestDigest string) (*Manifest, error) {
	if _, _, _, err := ParseLocation(location); err != nil {
		return nil, err
	}
	if err := validateDigest(manifestDigest); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", location, err)
	}
	rc, err := store.Get(ctx, manifestKey(location))
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, &DataLossError{Location: location, Err: err}
		}
		return nil, fmt.Errorf("snapshot %s: manifest: %w", location, err)
	}
	defer rc.Close()
	body, err := io.ReadAll(io.LimitReader(rc, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: manifest: %w", location, err)
	}
	if len(body) > maxManifestBytes {
		return nil, &DataLossError{Location: location, Err: fmt.Errorf("larger than %d bytes", maxManifestBytes)}
	}
	if got := digestOf(body); got != manifestDigest {
		return nil, &DataLossError{Location: location, Err: fmt.Errorf("digest mismatch: record has %s, stored manifest is %s", manifestDigest, got)}
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, &DataLossError{Location: location, Err: fmt.Errorf("undecodable: %w", err)}
	}
	if err := m.validate(location); err != nil {
		return nil, err
	}
	// The manifest was written after its chunks: the store held them.
	k := knownIn(store)
	for _, e := range m.Entries {
		k.add(e.Chunks...)
	}
	return &m, nil
}

// Download restores the snapshot at location into destDir, which must not
// exist or be empty, after verifying the manifest against manifestDigest
// and every file against the manifest. Missing or corrupt data fails with
// an ErrDataLoss naming the file. The tree is built in a sibling directory
// and renamed into place, so on any failure destDir is left as it was.
//
// Ownership is restored only when running as root. Files are not fsynced:
// a caller keeping the tree across a crash must sync or re-download it.
func Download(ctx context.Context, store ObjectStore, location, manifestDigest, destDir string) (err error) {
	m, err := ReadManifest(ctx, store, location, manifestDigest)
	if err != nil {
		return err
	}
	switch names, err := os.ReadDir(destDir); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("snapshot %s: destination: %w", location, err)
	case len(names) > 0:
		return fmt.Errorf("snapshot %s: destination %s is not empty", location, destDir)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(destDir), "."+filepath.Base(destDir)+".partial-*")
	if err != nil {
		return fmt.Errorf("snapshot %s: destination: %w", location, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err := restoreTree(ctx, store, m, tmp); err != nil {
		return err
	}
	// rename(2) replaces an empty directory atomically; os.Rename refuses
	// any existing directory.
	if err := unix.Rename(tmp, destDir); err != nil {
		return fmt.Errorf("snapshot %s: destination %s: %w", location, destDir, err)
	}
	return nil
}

// DownloadPart is Download of the part of the snapshot under the
// directory prefix (a slash path, as in the manifest): what a reader of
// one part needs (an actor's log), without its memory or volumes. A
// snapshot without that part restores an empty destDir.
func DownloadPart(ctx context.Context, store ObjectStore, location, manifestDigest, prefix, destDir string) error {
	m, err := ReadManifest(ctx, store, location, manifestDigest)
	if err != nil {
		return err
	}
	part := *m
	part.Entries = nil
	for _, e := range m.Entries {
		if e.Path == rootPath || e.Path == prefix || strings.HasPrefix(e.Path, prefix+"/") {
			part.Entries = append(part.Entries, e)
		}
	}
	return restoreTree(ctx, store, &part, destDir)
}

func restoreTree(ctx context.Context, store ObjectStore, m *Manifest, dir string) error {
	root, err := fstree.Open(dir)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", m.Location, err)
	}
	defer root.Close()
	var files []int
	for i := range m.Entries {
		e := &m.Entries[i]
		switch e.Type {
		case EntryDir:
			if i > 0 {
				if err := root.Mkdir(e.Path, 0o700); err != nil {
					return fmt.Errorf("snapshot %s: %w", m.Location, err)
				}
			}
		case EntryFile:
			files = append(files, i)
		}
	}
	largestFirst(m.Entries, files)
	if m.Version == manifestWholeFiles {
		err = forEach(ctx, runtime.GOMAXPROCS(0), files, func(ctx context.Context, i int) error {
			return fetchFile(ctx, store, m.Location, &m.Entries[i], root)
		})
	} else {
		err = fetchChunks(ctx, store, m, files, root)
	}
	if err != nil {
		return err
	}
	for i := range m.Entries {
		if e := &m.Entries[i]; e.Type == EntrySymlink {
			if err := root.Symlink(e.Target, e.Path); err != nil {
				return fmt.Errorf("snapshot %s: %w", m.Location, err)
			}
		}
	}
	// Children before parents: a directory's mtime must be set after its
	// entries are created, and a restrictive mode only once nothing more
	// is written below it.
	for i := len(m.Entries) - 1; i >= 0; i-- {
		e := &m.Entries[i]
		attrs := fstree.Attrs{Mode: e.Mode, UID: e.UID, GID: e.GID, ModTime: e.ModTime}
		if err := root.SetAttrs(e.Path, attrs); err != nil {
			return fmt.Errorf("snapshot %s: file %s: %w", m.Location, e.Path, err)
		}
	}
	return nil
}

// chunkAt is one chunk of a file to restore and where it goes.
type chunkAt struct {
	entry  *Entry
	chunk  Chunk
	offset int64
}

// fetchChunks creates the files of a chunked snapshot at their full size
// and writes every chunk at its offset as it arrives, in parallel; only
// the chunks in flight are in memory.
func fetchChunks(ctx context.Context, store ObjectStore, m *Manifest, files []int, root *fstree.Root) error {
	var work []chunkAt
	for _, i := range files {
		e := &m.Entries[i]
		f, err := root.OpenFile(e.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			err = f.Truncate(e.Size)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return fmt.Errorf("snapshot %s: file %s: %w", m.Location, e.Path, err)
		}
		var off int64
		for _, c := range e.Chunks {
			work = append(work, chunkAt{entry: e, chunk: c, offset: off})
			off += c.Size
		}
	}
	order := make([]int, len(work))
	for i := range order {
		order[i] = i
	}
	k := knownIn(store)
	return forEach(ctx, transferWorkers(), order, func(ctx context.Context, i int) error {
		err := fetchChunk(ctx, store, m.Location, work[i], root)
		if errors.Is(err, ErrDataLoss) {
			k.forget(work[i].chunk)
		}
		return err
	})
}

// fetchChunk fetches, decompresses and verifies one chunk and writes it
// in place. Data problems are DataLossErrors naming the chunk and file;
// store or local I/O failures are not.
func fetchChunk(ctx context.Context, store ObjectStore, location string, w chunkAt, root *fstree.Root) error {
	c := w.chunk
	lost := func(format string, args ...any) error {
		return &DataLossError{Location: location, File: w.entry.Path, Chunk: c.SHA256, Err: fmt.Errorf(format, args...)}
	}
	failed := func(err error) error {
		return fmt.Errorf("snapshot %s: file %s: chunk %s: %w", location, w.entry.Path, c.SHA256, err)
	}
	rc, err := store.Get(ctx, c.Key())
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return lost("object %s: %w", c.Key(), err)
		}
		return failed(err)
	}
	stored := chunkBuffers.Get().(*[]byte)
	defer chunkBuffers.Put(stored)
	// One byte more than recorded tells a longer object from the chunk.
	n, err := io.ReadFull(contextReader{ctx, rc}, (*stored)[:c.StoredSize+1])
	rc.Close()
	switch {
	case err != nil && err != io.ErrUnexpectedEOF && err != io.EOF:
		return failed(err)
	case int64(n) != c.StoredSize:
		return lost("stored object %s: size %d, want %d", c.Key(), n, c.StoredSize)
	}
	raw := chunkBuffers.Get().(*[]byte)
	defer chunkBuffers.Put(raw)
	data, err := chunkDecoder().DecodeAll((*stored)[:n], (*raw)[:0])
	switch {
	case err != nil:
		return lost("undecodable object %s: %w", c.Key(), err)
	case int64(len(data)) != c.Size:
		return lost("size %d, want %d", len(data), c.Size)
	case chunkSHA256(data) != c.SHA256:
		return lost("sha256 mismatch: got %s", chunkSHA256(data))
	}
	f, err := root.OpenFile(w.entry.Path, os.O_WRONLY, 0)
	if err != nil {
		return failed(err)
	}
	_, err = f.WriteAt(data, w.offset)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return failed(err)
	}
	return nil
}

// fetchFile streams one object through zstd into dest and checks sizes and
// digests of both the object and the content. Data problems are
// DataLossErrors; store or local I/O failures are not, since retrying
// them may succeed.
func fetchFile(ctx context.Context, store ObjectStore, location string, e *Entry, root *fstree.Root) error {
	lost := func(format string, args ...any) error {
		return &DataLossError{Location: location, File: e.Path, Err: fmt.Errorf(format, args...)}
	}
	failed := func(err error) error { return fmt.Errorf("snapshot %s: file %s: %w", location, e.Path, err) }

	rc, err := store.Get(ctx, location+"/"+e.Object)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return lost("object %s: %w", e.Object, err)
		}
		return failed(err)
	}
	defer rc.Close()
	src := &errorRecorder{r: contextReader{ctx, rc}}
	stored := newCountingHash()
	body := io.TeeReader(src, stored)
	dec, err := getDecoder(body)
	if err != nil {
		return failed(fmt.Errorf("zstd decoder: %w", err))
	}
	out, err := root.OpenFile(e.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return failed(err)
	}
	defer out.Close()
	sink := &errorRecorder{w: out}
	raw := newCountingHash()
	buf := copyBuffers.Get().(*[]byte)
	_, decodeErr := io.CopyBuffer(io.MultiWriter(sink, raw), io.LimitReader(dec, e.Size+1), *buf)
	copyBuffers.Put(buf)
	if decodeErr == nil {
		putDecoder(dec)
	}
	// Hash whatever the decoder left unread, so the object digest covers
	// the whole object.
	if _, err := io.Copy(io.Discard, body); err != nil && decodeErr == nil {
		decodeErr = err
	}
	switch {
	case src.err != nil:
		return failed(src.err)
	case sink.err != nil:
		return failed(sink.err)
	case stored.n != e.ObjectSize:
		return lost("stored object %s: size %d, want %d", e.Object, stored.n, e.ObjectSize)
	case stored.sum() != e.ObjectSHA256:
		return lost("stored object %s: sha256 mismatch: got %s, want %s", e.Object, stored.sum(), e.ObjectSHA256)
	case decodeErr != nil:
		return lost("undecodable object %s: %w", e.Object, decodeErr)
	case raw.n != e.Size:
		return lost("size %d, want %d", raw.n, e.Size)
	case raw.sum() != e.SHA256:
		return lost("sha256 mismatch: got %s, want %s", raw.sum(), e.SHA256)
	}
	if err := out.Close(); err != nil {
		return failed(err)
	}
	return nil
}

// copyBuffers are large so a memory image is written in few syscalls.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// errorRecorder remembers the error of the reader or writer it wraps, to
// tell a store or disk failure from undecodable data after the fact.
type errorRecorder struct {
	r   io.Reader
	w   io.Writer
	err error
}

func (e *errorRecorder) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

func (e *errorRecorder) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, err
}
