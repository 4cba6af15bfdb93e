package snapshot

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// treeEntry describes one path of a test tree.
type treeEntry struct {
	path    string
	mode    fs.FileMode // permission bits (and setuid etc.)
	content string      // files
	target  string      // symlinks
	dir     bool
}

// writeTree creates entries under root (parents first, as listed) and
// gives every entry a distinct, old modification time.
func writeTree(t testing.TB, root string, entries []treeEntry) {
	t.Helper()
	for _, e := range entries {
		p := filepath.Join(root, e.path)
		switch {
		case e.path == ".":
		case e.dir:
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		case e.target != "":
			if err := os.Symlink(e.target, p); err != nil {
				t.Fatal(err)
			}
		default:
			if err := os.WriteFile(p, []byte(e.content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Attributes after contents, deepest first, as a real tree would be.
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		p := filepath.Join(root, e.path)
		if e.target == "" {
			if err := os.Chmod(p, e.mode); err != nil {
				t.Fatal(err)
			}
		}
		mt := unix.NsecToTimespec(time.Date(2024, 1, 2, 3, 4, 5, i*1000, time.UTC).UnixNano())
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{mt, mt}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
}

// treeState is what a restore must reproduce of one path.
type treeState struct {
	mode     fs.FileMode
	uid, gid uint32
	mtime    time.Time
	content  string
	target   string
}

func readTree(t testing.TB, root string) map[string]treeState {
	t.Helper()
	out := map[string]treeState{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		s := treeState{mode: fi.Mode(), uid: st.Uid, gid: st.Gid}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s.content = string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			s.target, _ = os.Readlink(p)
		}
		s.mtime = fi.ModTime()
		out[filepath.ToSlash(rel)] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// recordingStore wraps a store, logs mutating calls and can fail them:
// failPut makes the Nth Put (1-based) fail; with crash, that failure also
// turns the whole store off, like a writer that died there.
type recordingStore struct {
	ObjectStore
	mu      sync.Mutex
	ops     []string
	puts    int
	failPut int
	crash   bool
	failAll bool
	gets    map[string]int
	// getErr, if set, is returned by Get for keys it returns true for.
	getErr func(key string) error
	// gate, if set, blocks every Get until it is closed.
	gate chan struct{}
	// beforePut, if set, runs before each Put reaches the store.
	beforePut func(key string)
}

var errInjected = errors.New("injected store failure")

func (r *recordingStore) Put(ctx context.Context, key string, body io.Reader) error {
	r.mu.Lock()
	r.puts++
	fail := r.failAll || r.puts == r.failPut
	if fail && r.crash {
		r.failAll = true
	}
	r.ops = append(r.ops, "put "+key)
	beforePut := r.beforePut
	r.mu.Unlock()
	if beforePut != nil {
		beforePut(key)
	}
	if fail {
		io.Copy(io.Discard, io.LimitReader(body, 100))
		return errInjected
	}
	return r.ObjectStore.Put(ctx, key, body)
}

func (r *recordingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	r.mu.Lock()
	if r.gets == nil {
		r.gets = map[string]int{}
	}
	r.gets[key]++
	gate, getErr := r.gate, r.getErr
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if getErr != nil {
		if err := getErr(key); err != nil {
			return nil, err
		}
	}
	return r.ObjectStore.Get(ctx, key)
}

func (r *recordingStore) Delete(ctx context.Context, key string) error {
	r.mu.Lock()
	r.ops = append(r.ops, "delete "+key)
	fail := r.failAll
	r.mu.Unlock()
	if fail {
		return errInjected
	}
	return r.ObjectStore.Delete(ctx, key)
}

func (r *recordingStore) manifestGets() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for k, v := range r.gets {
		if strings.HasSuffix(k, "/"+manifestName) {
			n += v
		}
	}
	return n
}

func (r *recordingStore) opsLog() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ops...)
}

// objectPath is where a DirStore keeps key, for tests that tamper.
func objectPath(s *DirStore, key string) string {
	return filepath.Join(s.Root(), filepath.FromSlash(key))
}

func mustUpload(t testing.TB, store ObjectStore, location string, entries []treeEntry) (*Manifest, string) {
	t.Helper()
	src := t.TempDir()
	writeTree(t, src, entries)
	m, digest, _, err := Upload(context.Background(), store, location, src)
	if err != nil {
		t.Fatalf("Upload %s: %v", location, err)
	}
	return m, digest
}

// mustUploadWholeFiles is mustUpload writing a version 1 snapshot.
func mustUploadWholeFiles(t testing.TB, store ObjectStore, location string, entries []treeEntry) (*Manifest, string) {
	t.Helper()
	src := t.TempDir()
	writeTree(t, src, entries)
	m, digest, _, err := uploadWholeFiles(context.Background(), store, location, src)
	if err != nil {
		t.Fatalf("uploadWholeFiles %s: %v", location, err)
	}
	return m, digest
}

func simpleTree(content string) []treeEntry {
	return []treeEntry{{path: "pages.img", mode: 0o644, content: content}}
}
