package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// incomingDir holds objects being written; keys may not start with it, so
// a half-written object never has a key.
const incomingDir = ".incoming"

// DirStore is an ObjectStore in a local directory: a key is a file path
// under the root. Objects are fsynced and renamed into place, so after a
// crash an object is either whole or absent.
type DirStore struct {
	root     string
	incoming string
}

var _ ObjectStore = (*DirStore)(nil)

// staleIncoming is how long a half-written object stays untouched before
// opening a store removes it. The directory is shared (the control plane
// and every node agent open it), so a younger one may be another
// process's put in progress: a put writes to it continuously.
const staleIncoming = time.Hour

// NewDirStore opens (creating if needed) a store rooted at dir. Leftovers
// of puts interrupted by a crash are removed once stale.
func NewDirStore(dir string) (*DirStore, error) {
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("object store directory %q: %w", dir, err)
	}
	s := &DirStore{root: root, incoming: filepath.Join(root, incomingDir)}
	if err := os.MkdirAll(s.incoming, 0o700); err != nil {
		return nil, fmt.Errorf("object store %s: %w", root, err)
	}
	if err := s.removeIncoming(time.Now().Add(-staleIncoming)); err != nil {
		return nil, fmt.Errorf("object store %s: clear incoming: %w", root, err)
	}
	return s, nil
}

// removeIncoming removes the half-written objects last written before
// cutoff.
func (s *DirStore) removeIncoming(cutoff time.Time) error {
	entries, err := os.ReadDir(s.incoming)
	if err != nil {
		return err
	}
	for _, e := range entries {
		fi, err := e.Info()
		if isMissing(err) {
			continue // its put finished or another process removed it
		}
		if err != nil {
			return err
		}
		if fi.ModTime().Before(cutoff) {
			if err := os.RemoveAll(filepath.Join(s.incoming, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// Root is the directory holding the objects.
func (s *DirStore) Root() string { return s.root }

func (s *DirStore) path(key string) (string, error) {
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	if key == incomingDir || strings.HasPrefix(key, incomingDir+"/") {
		return "", fmt.Errorf("%w %q: reserved prefix %s", ErrInvalidKey, key, incomingDir)
	}
	return filepath.Join(s.root, filepath.FromSlash(key)), nil
}

func (s *DirStore) Put(ctx context.Context, key string, r io.Reader) (err error) {
	path, err := s.path(key)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.incoming, "put-*")
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, contextReader{ctx, r}); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	// A concurrent Delete may prune the parent directory between mkdirs
	// and the rename; that is the only way the rename finds no directory.
	for attempt := 0; ; attempt++ {
		if err := s.mkdirs(filepath.Dir(path)); err != nil {
			return fmt.Errorf("put %s: %w", key, err)
		}
		err = os.Rename(tmp.Name(), path)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || attempt == 3 {
			return fmt.Errorf("put %s: %w", key, err)
		}
	}
	if err := syncPath(filepath.Dir(path)); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// mkdirs is os.MkdirAll that also makes each new directory entry durable,
// so a synced object cannot vanish with its unsynced parent.
func (s *DirStore) mkdirs(dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s: not a directory", dir)
		}
		return nil
	}
	if err := s.mkdirs(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncPath(filepath.Dir(dir))
}

func (s *DirStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	path, err := s.path(key)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	f, err := os.Open(path)
	if err != nil {
		if isMissing(err) {
			return nil, fmt.Errorf("get %s: %w", key, ErrNotFound)
		}
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	return f, nil
}

func (s *DirStore) Delete(ctx context.Context, key string) error {
	path, err := s.path(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	if err := os.Remove(path); err != nil {
		if isMissing(err) {
			return nil
		}
		return fmt.Errorf("delete %s: %w", key, err)
	}
	if err := syncPath(filepath.Dir(path)); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	// Prune directories left empty so deleted snapshots leave no trace;
	// the first non-empty one (ENOTEMPTY) stops the climb.
	for dir := filepath.Dir(path); dir != s.root; dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break
		}
	}
	return nil
}

func (s *DirStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	start := s.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		p, err := s.path(prefix[:i])
		if err != nil {
			return nil, fmt.Errorf("list %q: %w", prefix, err)
		}
		start = p
	}
	var out []ObjectInfo
	err := filepath.WalkDir(start, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			// Deletes prune directories while we walk; gone is fine.
			if isMissing(err) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() {
			if path == s.incoming {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(s.root, path)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if isMissing(err) {
				return nil
			}
			return err
		}
		out = append(out, ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	slices.SortFunc(out, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// isMissing: the path or one of its parents does not exist, or a parent is
// a file; for a key, all mean "no such object".
func isMissing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR)
}

// syncPath makes the file or directory at path durable.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// contextReader stops a long copy when its context ends.
type contextReader struct {
	ctx context.Context
	r   io.Reader
}

func (c contextReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
