package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sync/errgroup"
)

// Trees keeps snapshots as plain directory trees on this host: a node's
// local checkpoints, which never leave it. Keeping one costs a hash of
// its files and a hard link of each: nothing is compressed, cut into
// chunks or copied, and opening one hands out the directory itself, so a
// restore reads the pages where the capture wrote them.
//
// A kept tree is <root>/<location>/files plus its manifest (version
// manifestTree: every file's size and sha256) beside it, assembled under
// a temporary name and renamed into place: a tree is there whole or not
// at all. Its files are not synced; instead a tree is verified against
// its manifest the first time this process opens it (unless this process
// kept it), which catches what a host crash left half-written, as a
// DataLossError naming the file.
type Trees struct {
	root     string
	incoming string

	mu sync.Mutex
	// verified holds the manifest digest of each tree this process kept
	// or verified: its files are as its manifest says.
	verified map[string]string
}

const (
	treeFilesDir = "files"
	treeIncoming = ".incoming"
)

// NewTrees opens (creating it if need be) the trees under dir, and
// removes what a kept tree cut short left.
func NewTrees(dir string) (*Trees, error) {
	t := &Trees{root: dir, incoming: filepath.Join(dir, treeIncoming), verified: map[string]string{}}
	if err := os.RemoveAll(t.incoming); err != nil {
		return nil, fmt.Errorf("snapshot trees %s: %w", dir, err)
	}
	if err := os.MkdirAll(t.incoming, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot trees %s: %w", dir, err)
	}
	return t, nil
}

func (t *Trees) dir(location string) (string, error) {
	if _, _, _, err := ParseLocation(location); err != nil {
		return "", err
	}
	return filepath.Join(t.root, filepath.FromSlash(location)), nil
}

// Keep keeps the tree under srcDir as the snapshot at location and
// returns its manifest digest and size, as Upload does. srcDir is left as
// it was (its files are linked, not moved), so a caller that fails after
// Keep can keep it again. A tree already at location is this location's
// own earlier attempt (a location names one checkpoint): it is replaced.
func (t *Trees) Keep(ctx context.Context, location, srcDir string) (string, int64, error) {
	dst, err := t.dir(location)
	if err != nil {
		return "", 0, err
	}
	m, sources, err := scanTree(location, srcDir)
	if err != nil {
		return "", 0, fmt.Errorf("keep snapshot tree %s: %w", location, err)
	}
	m.Version, m.Compression = manifestTree, compressionNone
	work, err := os.MkdirTemp(t.incoming, "keep-*")
	if err != nil {
		return "", 0, fmt.Errorf("keep snapshot tree %s: %w", location, err)
	}
	defer os.RemoveAll(work)
	if err := linkTree(ctx, m, sources, filepath.Join(work, treeFilesDir)); err != nil {
		return "", 0, fmt.Errorf("keep snapshot tree %s: %w", location, err)
	}
	body, err := json.Marshal(m)
	if err != nil {
		return "", 0, fmt.Errorf("keep snapshot tree %s: encode manifest: %w", location, err)
	}
	if err := os.WriteFile(filepath.Join(work, manifestName), body, 0o600); err != nil {
		return "", 0, fmt.Errorf("keep snapshot tree %s: %w", location, err)
	}
	if err := t.Delete(location); err != nil {
		return "", 0, err
	}
	// A Delete of another tree of the actor may prune the parent
	// between MkdirAll and the rename; that is the only way the rename
	// finds no directory.
	for attempt := 0; ; attempt++ {
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return "", 0, fmt.Errorf("keep snapshot tree %s: %w", location, err)
		}
		err := os.Rename(work, dst)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || attempt == 3 {
			return "", 0, fmt.Errorf("keep snapshot tree %s: %w", location, err)
		}
	}
	digest := digestOf(body)
	t.mu.Lock()
	t.verified[location] = digest
	t.mu.Unlock()
	return digest, m.Size() + int64(len(body)), nil
}

// linkTree makes the manifest's tree under dst from sources: directories
// and symlinks made anew, each file hard-linked (copied where the two
// are on different filesystems) and hashed into its entry.
func linkTree(ctx context.Context, m *Manifest, sources map[int]string, dst string) error {
	for _, e := range m.Entries {
		path := filepath.Join(dst, filepath.FromSlash(e.Path))
		switch e.Type {
		case EntryDir:
			if err := os.Mkdir(path, 0o700); err != nil {
				return err
			}
		case EntrySymlink:
			if err := os.Symlink(e.Target, path); err != nil {
				return err
			}
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(transferWorkers())
	for i, src := range sources {
		e := &m.Entries[i]
		g.Go(func() error {
			path := filepath.Join(dst, filepath.FromSlash(e.Path))
			if err := os.Link(src, path); errors.Is(err, syscall.EXDEV) {
				err = copyFile(src, path)
			} else if err != nil {
				return fmt.Errorf("%s: %w", e.Path, err)
			}
			sum, size, err := hashFile(ctx, path)
			if err != nil {
				return fmt.Errorf("%s: %w", e.Path, err)
			}
			e.SHA256, e.Size = sum, size
			return nil
		})
	}
	return g.Wait()
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func hashFile(ctx context.Context, path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, contextReader{ctx, f})
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// Open returns the directory of the tree kept at location, whose
// manifest digest must be digest, verified against its manifest unless
// this process kept or verified it already. ErrNotFound (wrapped) if no
// tree is kept there; a DataLossError if it is not as kept. The caller
// only reads it.
func (t *Trees) Open(ctx context.Context, location, digest string) (string, error) {
	dir, err := t.dir(location)
	if err != nil {
		return "", err
	}
	body, err := os.ReadFile(filepath.Join(dir, manifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("snapshot tree %s: %w", location, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("snapshot tree %s: %w", location, err)
	}
	if got := digestOf(body); got != digest {
		return "", &DataLossError{Location: location, Err: fmt.Errorf("manifest digest %s, recorded %s", got, digest)}
	}
	files := filepath.Join(dir, treeFilesDir)
	t.mu.Lock()
	known := t.verified[location] == digest
	t.mu.Unlock()
	if known {
		return files, nil
	}
	var m Manifest
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&m); err != nil {
		return "", &DataLossError{Location: location, Err: fmt.Errorf("manifest: %w", err)}
	}
	if err := m.validateAs(location, manifestTree); err != nil {
		return "", err
	}
	if err := verifyTree(ctx, &m, files); err != nil {
		return "", err
	}
	t.mu.Lock()
	t.verified[location] = digest
	t.mu.Unlock()
	return files, nil
}

// verifyTree checks that dir holds the manifest's tree: every entry of
// its type, every file of its size and sha256.
func verifyTree(ctx context.Context, m *Manifest, dir string) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(transferWorkers())
	for _, e := range m.Entries {
		path := filepath.Join(dir, filepath.FromSlash(e.Path))
		fi, err := os.Lstat(path)
		if err != nil {
			return &DataLossError{Location: m.Location, File: e.Path, Err: err}
		}
		switch e.Type {
		case EntryDir:
			if !fi.IsDir() {
				return &DataLossError{Location: m.Location, File: e.Path, Err: errors.New("not a directory")}
			}
		case EntrySymlink:
			if target, err := os.Readlink(path); err != nil || target != e.Target {
				return &DataLossError{Location: m.Location, File: e.Path, Err: fmt.Errorf("symlink to %q, kept to %q (%v)", target, e.Target, err)}
			}
		case EntryFile:
			g.Go(func() error {
				sum, size, err := hashFile(ctx, path)
				switch {
				case err != nil:
					return &DataLossError{Location: m.Location, File: e.Path, Err: err}
				case size != e.Size || sum != e.SHA256:
					return &DataLossError{Location: m.Location, File: e.Path, Err: fmt.Errorf("%d bytes of sha256 %s, kept %d bytes of %s", size, sum, e.Size, e.SHA256)}
				}
				return nil
			})
		}
	}
	return g.Wait()
}

// Delete removes the tree kept at location; no error if there is none.
func (t *Trees) Delete(location string) error {
	dir, err := t.dir(location)
	if err != nil {
		return err
	}
	t.mu.Lock()
	delete(t.verified, location)
	t.mu.Unlock()
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("delete snapshot tree %s: %w", location, err)
	}
	// Empty parents (the actor's directory, its space's) go too.
	for parent := filepath.Dir(dir); parent != t.root && strings.HasPrefix(parent, t.root); parent = filepath.Dir(parent) {
		if os.Remove(parent) != nil {
			break
		}
	}
	return nil
}

// Locations lists the locations of the trees kept under prefix (a
// location's leading segments: a space, or a space and an actor uid).
func (t *Trees) Locations(prefix string) ([]string, error) {
	var out []string
	base := filepath.Join(t.root, filepath.FromSlash(prefix))
	err := filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if path == t.incoming {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(t.root, path)
		if err != nil {
			return err
		}
		if _, _, _, err := ParseLocation(filepath.ToSlash(rel)); err == nil {
			out = append(out, filepath.ToSlash(rel))
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot trees under %q: %w", prefix, err)
	}
	return out, nil
}
