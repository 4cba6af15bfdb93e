package snapshot

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// chunkPuts counts the chunk objects a store was asked to put.
func chunkPuts(r *recordingStore) int {
	n := 0
	for _, op := range r.opsLog() {
		if strings.HasPrefix(op, "put "+chunksDir+"/") {
			n++
		}
	}
	return n
}

// TestUploadSkipsChunksTheStoreHolds: a second snapshot of a tree with a
// small change puts only the chunks around the change, on every backend,
// and both snapshots restore exactly.
func TestUploadSkipsChunksTheStoreHolds(t *testing.T) {
	for _, b := range objectStoreBackends {
		t.Run(b.name, func(t *testing.T) {
			store := &recordingStore{ObjectStore: b.open(t, "")}
			// Random: runs of zeros make the chunker cut at its minimum
			// size, and so re-find its cuts after a change only slowly.
			image := randomContent(8<<20, 3)
			first := []treeEntry{
				{path: "pages.img", mode: 0o644, content: string(image)},
				{path: "checkpoint.img", mode: 0o644, content: "state"},
			}
			m1, d1 := mustUpload(t, store, "default/a/s1", first)
			total := chunkPuts(store)
			if n := len(m1.Entries[2].Chunks); n < 4 || total != n+1 {
				t.Fatalf("first upload: %d chunk puts for %d chunks of pages.img (+1), want every chunk put once", total, n)
			}

			// 64 KiB rewritten and 5 bytes inserted in the middle: a
			// content-defined cut finds its place again after both, one
			// or two cuts later if the first one after the change fell
			// in it (fixed offsets would put every chunk after it).
			changed := bytes.Clone(image[:4<<20])
			changed = append(changed, bytes.Repeat([]byte{0x5a}, 64<<10)...)
			changed = append(changed, []byte("shift")...)
			changed = append(changed, image[4<<20+64<<10:]...)
			second := []treeEntry{
				{path: "pages.img", mode: 0o644, content: string(changed)},
				{path: "checkpoint.img", mode: 0o644, content: "state"},
			}
			m2, d2 := mustUpload(t, store, "default/a/s2", second)
			put := chunkPuts(store) - total
			if put == 0 || put > 3 {
				t.Errorf("second upload put %d chunks of %d, want 1 to 3 (those around the change)", put, len(m2.Entries[2].Chunks))
			}

			// Another process knows nothing until it reads a manifest
			// (the actor's previous snapshot, when it restored it).
			known.Delete(store)
			if _, err := ReadManifest(t.Context(), store, "default/a/s2", d2); err != nil {
				t.Fatal(err)
			}
			before := chunkPuts(store)
			mustUpload(t, store, "default/a/s3", second)
			if put := chunkPuts(store) - before; put != 0 {
				t.Errorf("upload of an unchanged tree after reading its manifest put %d chunks, want 0", put)
			}

			for loc, want := range map[string]map[string]string{"default/a/s1": {"pages.img": string(image)}, "default/a/s2": {"pages.img": string(changed)}} {
				digest := map[string]string{"default/a/s1": d1, "default/a/s2": d2}[loc]
				dest := filepath.Join(t.TempDir(), "d")
				if err := Download(t.Context(), store, loc, digest, dest); err != nil {
					t.Fatalf("Download %s: %v", loc, err)
				}
				if got, _ := os.ReadFile(filepath.Join(dest, "pages.img")); !bytes.Equal(got, []byte(want["pages.img"])) {
					t.Errorf("%s: pages.img restored differs (%d bytes, want %d)", loc, len(got), len(want["pages.img"]))
				}
			}
		})
	}
}

// TestWholeFileSnapshotsStillDownload: version 1 snapshots, in stores
// written before chunks, restore and are verified as before.
func TestWholeFileSnapshotsStillDownload(t *testing.T) {
	s := newDirStore(t)
	const loc = "default/a/v1"
	tree := []treeEntry{
		{path: "pages.img", mode: 0o600, content: string(mixedContent(1<<20, 4))},
		{path: "vol", dir: true, mode: 0o755},
		{path: "vol/state.db", mode: 0o644, content: "state"},
	}
	m, digest := mustUploadWholeFiles(t, s, loc, tree)
	dest := filepath.Join(t.TempDir(), "d")
	if err := Download(t.Context(), s, loc, digest, dest); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dest, "vol/state.db")); string(got) != "state" {
		t.Errorf("vol/state.db = %q", got)
	}
	if err := os.Remove(objectPath(s, loc+"/"+m.Entries[1].Object)); err != nil {
		t.Fatal(err)
	}
	err := Download(t.Context(), s, loc, digest, filepath.Join(t.TempDir(), "d"))
	if !errors.Is(err, ErrDataLoss) || !strings.Contains(err.Error(), "file "+m.Entries[1].Path) {
		t.Errorf("Download with an object missing = %v, want ErrDataLoss naming the file", err)
	}
}

func randomContent(n int, seed uint64) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, seed))
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	return b
}

// putChunk stores content as a chunk written at the given time, as an
// upload then would have.
func putChunk(t *testing.T, s ObjectStore, content string, written time.Time) Chunk {
	t.Helper()
	stored := chunkEncoder().EncodeAll([]byte(content), nil)
	c := Chunk{SHA256: chunkSHA256([]byte(content)), Size: int64(len(content)), Written: written.Unix(), StoredSize: int64(len(stored))}
	if err := s.Put(t.Context(), c.Key(), bytes.NewReader(stored)); err != nil {
		t.Fatal(err)
	}
	return c
}

// putManifest stores a snapshot of one file made of chunks.
func putManifest(t *testing.T, s ObjectStore, location string, chunks ...Chunk) string {
	t.Helper()
	e := Entry{Path: "pages.img", Type: EntryFile, Mode: 0o600, Chunks: chunks}
	for _, c := range chunks {
		e.Size += c.Size
	}
	m := Manifest{Version: manifestChunked, Location: location, Compression: compressionZstd,
		Entries: []Entry{{Path: rootPath, Type: EntryDir, Mode: 0o700}, e}}
	body, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(t.Context(), manifestKey(location), bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	return digestOf(body)
}

func TestSweepChunks(t *testing.T) {
	now := time.Now()
	old := now.Add(-ChunkGrace - time.Hour)
	reusable := now.Add(-ChunkReuseWindow + time.Hour)
	tests := []struct {
		name      string
		written   time.Time
		named     bool // by a manifest in the store
		wantKept  bool
		otherSnap bool // named by a second manifest, the first deleted
	}{
		{"old, named by a manifest", old, true, true, false},
		{"old, named only by a manifest kept after another was deleted", old, true, true, true},
		{"old, named by no manifest", old, false, false, false},
		{"reusable by an upload, named by no manifest", reusable, false, true, false},
		{"past reuse but within the upload deadline, named by no manifest", now.Add(-ChunkReuseWindow - time.Minute), false, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newDirStore(t)
			c := putChunk(t, s, "chunk content "+tt.name, tt.written)
			if tt.named {
				putManifest(t, s, "default/a/s1", c)
			}
			if tt.otherSnap {
				putManifest(t, s, "default/b/s2", c)
				if err := DeleteSnapshot(t.Context(), s, "default/a/s1"); err != nil {
					t.Fatal(err)
				}
			}
			// Not a chunk key: sweeps leave it alone.
			if err := s.Put(t.Context(), chunksDir+"/zz/not-a-chunk", strings.NewReader("x")); err != nil {
				t.Fatal(err)
			}
			for sweep := range 2 {
				if _, err := SweepChunks(t.Context(), s, ChunkGrace); err != nil {
					t.Fatal(err)
				}
				_, err := s.Get(t.Context(), c.Key())
				if kept := err == nil; kept != tt.wantKept {
					t.Errorf("after sweep %d: chunk kept = %v (%v), want %v", sweep+1, kept, err, tt.wantKept)
				}
			}
			if _, err := s.Get(t.Context(), chunksDir+"/zz/not-a-chunk"); err != nil {
				t.Errorf("a sweep removed an object that is not a chunk: %v", err)
			}
		})
	}
}

// TestSweepRacingAnUploadThatReusesAChunk is the race the grace exists
// for: an upload names a chunk it did not put, whose only manifest is
// deleted and swept before the upload's manifest lands.
func TestSweepRacingAnUploadThatReusesAChunk(t *testing.T) {
	s := newDirStore(t)
	store := &recordingStore{ObjectStore: s}
	tree := simpleTree(string(mixedContent(1<<20, 9)))
	m1, _ := mustUpload(t, store, "default/a/s1", tree)
	firstPuts := chunkPuts(store)
	// The upload of s2 knows s1's chunks and will not put them. Between
	// its decision and its manifest, s1 is deleted and a sweep runs.
	store.beforePut = func(key string) {
		if key == manifestKey("default/a/s2") {
			if err := DeleteSnapshot(t.Context(), s, "default/a/s1"); err != nil {
				t.Error(err)
			}
			if n, err := SweepChunks(t.Context(), s, ChunkGrace); err != nil || n != 0 {
				t.Errorf("sweep during the upload deleted %d chunks (%v), want 0", n, err)
			}
		}
	}
	_, d2, _, err := Upload(t.Context(), store, "default/a/s2", writtenTree(t, tree))
	if err != nil {
		t.Fatal(err)
	}
	if n := chunkPuts(store) - firstPuts; n != 0 {
		t.Fatalf("upload put %d chunks, want 0 (all known from s1's %d)", n, len(m1.Entries[1].Chunks))
	}
	if err := Download(t.Context(), s, "default/a/s2", d2, filepath.Join(t.TempDir(), "d")); err != nil {
		t.Errorf("Download of the snapshot that reused the chunks: %v", err)
	}

	// A sweep without grace (a store only this process writes, uploads
	// held off) deletes at once, and forgets what it deleted: the next
	// upload puts the chunks again instead of naming missing ones.
	if err := DeleteSnapshot(t.Context(), s, "default/a/s2"); err != nil {
		t.Fatal(err)
	}
	if n, err := SweepChunks(t.Context(), s, 0); err != nil || n != len(m1.Entries[1].Chunks) {
		t.Fatalf("sweep with no grace deleted %d chunks (%v), want %d", n, err, len(m1.Entries[1].Chunks))
	}
	_, d3 := mustUpload(t, s, "default/a/s3", tree)
	if err := Download(t.Context(), s, "default/a/s3", d3, filepath.Join(t.TempDir(), "d")); err != nil {
		t.Errorf("Download after a sweep with no grace: %v", err)
	}
}

// TestSweepStopsOnAManifestItCannotRead: the chunks an unreadable
// manifest names are unknown, so nothing is deleted.
func TestSweepStopsOnAManifestItCannotRead(t *testing.T) {
	s := newDirStore(t)
	c := putChunk(t, s, "orphan", time.Now().Add(-ChunkGrace-time.Hour))
	if err := s.Put(t.Context(), manifestKey("default/a/s1"), strings.NewReader("{not json")); err != nil {
		t.Fatal(err)
	}
	if n, err := SweepChunks(t.Context(), s, ChunkGrace); err == nil || n != 0 {
		t.Fatalf("SweepChunks = %d, %v; want an error and nothing deleted", n, err)
	}
	if _, err := s.Get(t.Context(), c.Key()); err != nil {
		t.Errorf("chunk deleted by a sweep that could not read every manifest: %v", err)
	}
}

func writtenTree(t *testing.T, entries []treeEntry) string {
	t.Helper()
	dir := t.TempDir()
	writeTree(t, dir, entries)
	return dir
}
