package snapshot

import (
	"context"
	"encoding/hex"
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
	"syscall"

	"github.com/zeebo/blake3"
	"golang.org/x/sync/errgroup"
)

// Trees keeps snapshots as plain directory trees on this host: a node's
// local checkpoints, which never leave it. Keeping one costs a hard link
// of each of its files and a manifest: nothing is compressed, cut into
// chunks, copied or hashed while the caller waits, and opening one hands
// out the directory itself, so a restore reads the pages where the
// capture wrote them.
//
// A kept tree is <root>/<location>/files plus its manifest beside it
// (version manifestTree: every file's size, and the host's boot id),
// assembled under a temporary name and renamed into place: a tree is
// there whole or not at all. Until the host restarts, its files are as
// kept (the page cache holds them, whatever process comes and goes), so
// within the boot that kept it a tree is trusted as it is. To outlive a
// restart it is sealed (Seal, off the caller's path): its files synced
// and hashed (BLAKE3 of each treeSegment piece) into a seal file beside
// the manifest. A tree kept in an earlier boot is verified against its
// seal the first time it is opened; one the host restarted before it
// was sealed, or whose files differ, is a DataLossError naming the file.
type Trees struct {
	root     string
	incoming string
	// boot is this host's boot id: a tree kept under it needs no check.
	boot string

	mu sync.Mutex
	// verified holds the manifest digest of each tree kept in an earlier
	// boot that this process verified.
	verified map[string]string
	// busy serializes Seal and Delete of one location.
	busy map[string]*sync.Mutex
}

const (
	treeFilesDir = "files"
	treeIncoming = ".incoming"
	treeSealName = "seal.json"
	// bootIDFile changes at every boot of the host.
	bootIDFile = "/proc/sys/kernel/random/boot_id"
)

// treeSegment is the piece of a file one hash covers in a seal: a memory
// image is one big file, and its pieces are hashed in parallel. The hash
// is BLAKE3 (256 bits), not the sha256 of stored snapshots: on this CPU
// it hashes 3.1 GB/s a core, sha256 1.4 (SHA-NI).
const treeSegment = 16 << 20

// seal is a kept tree's seal: the manifest it seals, and the hashes of
// its files' pieces by manifest entry index.
type seal struct {
	Manifest string           `json:"manifest"`
	Segments map[int][]string `json:"segments"`
}

// NewTrees opens (creating it if need be) the trees under dir, and
// removes what a kept tree cut short left.
func NewTrees(dir string) (*Trees, error) {
	boot, err := os.ReadFile(bootIDFile)
	if err != nil {
		return nil, fmt.Errorf("snapshot trees %s: the host's boot id: %w", dir, err)
	}
	return newTrees(dir, strings.TrimSpace(string(boot)))
}

func newTrees(dir, boot string) (*Trees, error) {
	t := &Trees{root: dir, incoming: filepath.Join(dir, treeIncoming), boot: boot, verified: map[string]string{}, busy: map[string]*sync.Mutex{}}
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

// lock holds location against a Seal or Delete of it.
func (t *Trees) lock(location string) func() {
	t.mu.Lock()
	l, ok := t.busy[location]
	if !ok {
		l = &sync.Mutex{}
		t.busy[location] = l
	}
	t.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Keep keeps the tree under srcDir as the snapshot at location and
// returns its manifest digest and size, as Upload does; Seal makes it
// outlive a restart of the host. srcDir is left as it was (its files are
// linked, not moved), so a caller that fails after Keep can keep it
// again. A tree already at location is this location's own earlier
// attempt (a location names one checkpoint): it is replaced.
func (t *Trees) Keep(ctx context.Context, location, srcDir string) (string, int64, error) {
	dst, err := t.dir(location)
	if err != nil {
		return "", 0, err
	}
	m, sources, err := scanTree(location, srcDir)
	if err != nil {
		return "", 0, fmt.Errorf("keep snapshot tree %s: %w", location, err)
	}
	m.Version, m.Compression, m.Boot = manifestTree, compressionNone, t.boot
	work, err := os.MkdirTemp(t.incoming, "keep-*")
	if err != nil {
		return "", 0, fmt.Errorf("keep snapshot tree %s: %w", location, err)
	}
	defer os.RemoveAll(work)
	if err := linkTree(m, sources, filepath.Join(work, treeFilesDir)); err != nil {
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
	return digestOf(body), m.Size() + int64(len(body)), nil
}

// linkTree makes the manifest's tree under dst from sources: directories
// and symlinks made anew, each file hard-linked (copied where the two
// are on different filesystems).
func linkTree(m *Manifest, sources map[int]string, dst string) error {
	for i, e := range m.Entries {
		path := filepath.Join(dst, filepath.FromSlash(e.Path))
		var err error
		switch e.Type {
		case EntryDir:
			err = os.Mkdir(path, 0o700)
		case EntrySymlink:
			err = os.Symlink(e.Target, path)
		case EntryFile:
			if err = os.Link(sources[i], path); errors.Is(err, syscall.EXDEV) {
				err = copyFile(sources[i], path)
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", e.Path, err)
		}
	}
	return nil
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

// Seal makes the tree kept at location outlive a restart of the host:
// its files and directories synced, its files hashed into its seal,
// written last. Sealing a sealed tree, or one deleted meanwhile, does
// nothing.
func (t *Trees) Seal(ctx context.Context, location string) error {
	dir, err := t.dir(location)
	if err != nil {
		return err
	}
	defer t.lock(location)()
	if _, err := os.Stat(filepath.Join(dir, treeSealName)); err == nil {
		return nil
	}
	body, err := os.ReadFile(filepath.Join(dir, manifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("seal snapshot tree %s: %w", location, err)
	}
	m, err := decodeTreeManifest(location, body)
	if err != nil {
		return err
	}
	files := filepath.Join(dir, treeFilesDir)
	// Half the CPUs: a seal runs beside the node's work (the pause's
	// end, the next start), which it must not hold up.
	segments, err := hashFiles(ctx, m, files, true, max(1, runtime.GOMAXPROCS(0)/2))
	if err != nil {
		return fmt.Errorf("seal snapshot tree %s: %w", location, err)
	}
	// Directories deepest first, the tree's own and its parents last.
	for i := len(m.Entries) - 1; i >= 0; i-- {
		if e := m.Entries[i]; e.Type == EntryDir {
			if err := syncPath(filepath.Join(files, filepath.FromSlash(e.Path))); err != nil {
				return fmt.Errorf("seal snapshot tree %s: %w", location, err)
			}
		}
	}
	sealBody, err := json.Marshal(seal{Manifest: digestOf(body), Segments: segments})
	if err != nil {
		return fmt.Errorf("seal snapshot tree %s: %w", location, err)
	}
	tmp := filepath.Join(dir, treeSealName+".tmp")
	if err := writeSynced(tmp, sealBody); err != nil {
		return fmt.Errorf("seal snapshot tree %s: %w", location, err)
	}
	if err := syncPath(filepath.Join(dir, manifestName)); err != nil {
		return fmt.Errorf("seal snapshot tree %s: %w", location, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, treeSealName)); err != nil {
		return fmt.Errorf("seal snapshot tree %s: %w", location, err)
	}
	for d := dir; d != filepath.Dir(t.root); d = filepath.Dir(d) {
		if err := syncPath(d); err != nil {
			return fmt.Errorf("seal snapshot tree %s: %w", location, err)
		}
	}
	return nil
}

// writeSynced writes body to path and syncs it.
func writeSynced(path string, body []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(body); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// hashFiles hashes every file entry of m under dir, piece by piece, on
// up to workers CPUs, and syncs it first with sync set; each entry's size
// must be the file's. It returns the pieces' BLAKE3 (hex) by entry index. A
// file shorter than its entry is data loss naming it.
func hashFiles(ctx context.Context, m *Manifest, dir string, sync bool, workers int) (map[int][]string, error) {
	sums := map[int][]string{}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i, e := range m.Entries {
		if e.Type != EntryFile {
			continue
		}
		f, err := os.Open(filepath.Join(dir, filepath.FromSlash(e.Path)))
		if err != nil {
			return nil, &DataLossError{Location: m.Location, File: e.Path, Err: err}
		}
		defer f.Close()
		if sync {
			if err := f.Sync(); err != nil {
				return nil, fmt.Errorf("%s: %w", e.Path, err)
			}
		}
		segments := make([]string, (e.Size+treeSegment-1)/treeSegment)
		sums[i] = segments
		for k := range segments {
			g.Go(func() error {
				off := int64(k) * treeSegment
				n := min(treeSegment, e.Size-off)
				h := blake3.New()
				read, err := io.Copy(h, contextReader{ctx, io.NewSectionReader(f, off, n)})
				if err == nil && read != n {
					err = fmt.Errorf("%d bytes, kept %d", off+read, e.Size)
				}
				if err != nil {
					return &DataLossError{Location: m.Location, File: e.Path, Err: err}
				}
				segments[k] = hex.EncodeToString(h.Sum(nil))
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return sums, nil
}

// Unsealed lists the trees kept in this boot of the host that are not
// sealed: those a process stopped before it sealed them.
func (t *Trees) Unsealed() ([]string, error) {
	all, err := t.Locations("")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range all {
		dir := filepath.Join(t.root, filepath.FromSlash(l))
		if _, err := os.Stat(filepath.Join(dir, treeSealName)); err == nil {
			continue
		}
		body, err := os.ReadFile(filepath.Join(dir, manifestName))
		if err != nil {
			continue // deleted meanwhile
		}
		if m, err := decodeTreeManifest(l, body); err == nil && m.Boot == t.boot {
			out = append(out, l)
		}
	}
	return out, nil
}

// Open returns the directory of the tree kept at location, whose
// manifest digest must be digest. A tree kept in an earlier boot of the
// host is verified against its seal first (once per process).
// ErrNotFound (wrapped) if no tree is kept there; a DataLossError if it
// is not as kept. The caller only reads it.
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
	m, err := decodeTreeManifest(location, body)
	if err != nil {
		return "", err
	}
	files := filepath.Join(dir, treeFilesDir)
	t.mu.Lock()
	known := m.Boot == t.boot || t.verified[location] == digest
	t.mu.Unlock()
	if known {
		return files, nil
	}
	if err := verifyTree(ctx, m, digest, dir); err != nil {
		return "", err
	}
	t.mu.Lock()
	t.verified[location] = digest
	t.mu.Unlock()
	return files, nil
}

func decodeTreeManifest(location string, body []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, &DataLossError{Location: location, Err: fmt.Errorf("manifest: %w", err)}
	}
	if err := m.validateAs(location, manifestTree); err != nil {
		return nil, err
	}
	return &m, nil
}

// verifyTree checks a tree kept in an earlier boot against its seal:
// every entry of its type, every file of its size and its pieces'
// hashes.
func verifyTree(ctx context.Context, m *Manifest, digest, dir string) error {
	body, err := os.ReadFile(filepath.Join(dir, treeSealName))
	if errors.Is(err, fs.ErrNotExist) {
		return &DataLossError{Location: m.Location, Err: errors.New("kept in an earlier boot of this host and not sealed before it ended: its files may not have reached the disk")}
	}
	if err != nil {
		return &DataLossError{Location: m.Location, Err: fmt.Errorf("seal: %w", err)}
	}
	var s seal
	if err := json.Unmarshal(body, &s); err != nil || s.Manifest != digest {
		return &DataLossError{Location: m.Location, Err: fmt.Errorf("seal of manifest %q, not of this one (%v)", s.Manifest, err)}
	}
	files := filepath.Join(dir, treeFilesDir)
	for i, e := range m.Entries {
		path := filepath.Join(files, filepath.FromSlash(e.Path))
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
			if !fi.Mode().IsRegular() || fi.Size() != e.Size {
				return &DataLossError{Location: m.Location, File: e.Path, Err: fmt.Errorf("%d bytes (%s), kept %d", fi.Size(), fi.Mode().Type(), e.Size)}
			}
			if want := (e.Size + treeSegment - 1) / treeSegment; int64(len(s.Segments[i])) != want {
				return &DataLossError{Location: m.Location, File: e.Path, Err: fmt.Errorf("the seal has %d piece hashes for %d bytes", len(s.Segments[i]), e.Size)}
			}
		}
	}
	sums, err := hashFiles(ctx, m, files, false, runtime.GOMAXPROCS(0))
	if err != nil {
		return err
	}
	for i, segments := range sums {
		e := m.Entries[i]
		for k, sum := range segments {
			if sum != s.Segments[i][k] {
				return &DataLossError{Location: m.Location, File: e.Path, Err: fmt.Errorf("bytes %d..%d: BLAKE3 %s, sealed %s", int64(k)*treeSegment, min(int64(k+1)*treeSegment, e.Size), sum, s.Segments[i][k])}
			}
		}
	}
	return nil
}

// Delete removes the tree kept at location, waiting for a Seal of it
// under way; no error if there is none.
func (t *Trees) Delete(location string) error {
	dir, err := t.dir(location)
	if err != nil {
		return err
	}
	unlock := t.lock(location)
	defer unlock()
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
// location's leading segments: a space, or a space and an actor uid; ""
// for all).
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
