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
	"syscall"
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
	digest, size, err := uploadTree(ctx, store, m, sources)
	if err != nil {
		// The caller's context may be what failed; cleanup still has to run.
		if derr := DeleteSnapshot(context.WithoutCancel(ctx), store, location); derr != nil {
			slog.WarnContext(ctx, "snapshot: cleanup of failed upload", "location", location, "err", derr)
		}
		return nil, "", 0, fmt.Errorf("upload snapshot %s: %w", location, err)
	}
	return m, digest, size, nil
}

func uploadTree(ctx context.Context, store ObjectStore, m *Manifest, sources map[int]string) (string, int64, error) {
	files := make([]int, 0, len(sources))
	for i := range sources {
		files = append(files, i)
	}
	largestFirst(m.Entries, files)
	err := forEach(ctx, files, func(ctx context.Context, i int) error {
		e := &m.Entries[i]
		if err := uploadFile(ctx, store, m.Location+"/"+e.Object, sources[i], e); err != nil {
			return fmt.Errorf("file %s: %w", e.Path, err)
		}
		return nil
	})
	if err != nil {
		return "", 0, err
	}
	body, err := json.Marshal(m)
	if err != nil {
		return "", 0, fmt.Errorf("encode manifest: %w", err)
	}
	if err := store.Put(ctx, manifestKey(m.Location), bytes.NewReader(body)); err != nil {
		return "", 0, fmt.Errorf("manifest: %w", err)
	}
	return digestOf(body), m.StoredSize() + int64(len(body)), nil
}

// uploadFile streams one file through zstd into the store, hashing both
// sides, and fills in the entry's sizes and digests from what was sent.
func uploadFile(ctx context.Context, store ObjectStore, key, src string, e *Entry) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	raw, stored := newCountingHash(), newCountingHash()
	pr, pw := io.Pipe()
	encoded := make(chan error, 1)
	go func() {
		err := encodeTo(io.MultiWriter(pw, stored), io.TeeReader(f, raw))
		pw.CloseWithError(err)
		encoded <- err
	}()
	putErr := store.Put(ctx, key, pr)
	// Unblocks the encoder if Put gave up before reading everything.
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

func encodeTo(w io.Writer, r io.Reader) error {
	enc, err := getEncoder(w)
	if err != nil {
		return fmt.Errorf("zstd encoder: %w", err)
	}
	_, err = enc.ReadFrom(r)
	if cerr := enc.Close(); err == nil {
		err = cerr
	}
	putEncoder(enc)
	return err
}

// scanTree lists srcDir into a manifest with file digests still empty, and
// the source path of each file entry by index.
func scanTree(location, srcDir string) (*Manifest, map[int]string, error) {
	root, err := filepath.EvalSymlinks(srcDir)
	if err != nil {
		return nil, nil, fmt.Errorf("source directory: %w", err)
	}
	m := &Manifest{Version: manifestVersion, Location: location, Compression: compressionZstd}
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
			e.Object = fmt.Sprintf("%s/%d.zst", filesDir, len(sources))
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
