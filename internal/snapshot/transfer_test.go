package snapshot

import (
	"encoding/json"
	"errors"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// mixedContent imitates a memory image: zero pages, random pages and
// repetitive pages, deterministic for a seed.
func mixedContent(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	text := []byte("GET /counter HTTP/1.1\r\nHost: actor.default.torpor\r\n\r\n")
	for off := 0; off < n; off += 4096 {
		page := b[off:min(off+4096, n)]
		switch rng.IntN(4) {
		case 0: // random
			for i := range page {
				page[i] = byte(rng.Uint32())
			}
		case 1: // repetitive
			for i := range page {
				page[i] = text[i%len(text)]
			}
		} // otherwise zero
	}
	return b
}

// TestRoundTrip uploads and downloads a tree with every kind of entry on
// each backend.
func TestRoundTrip(t *testing.T) {
	for _, b := range objectStoreBackends {
		t.Run(b.name, func(t *testing.T) { testRoundTrip(t, b.open(t, "")) })
	}
}

func testRoundTrip(t *testing.T, base ObjectStore) {
	ctx := t.Context()
	store := &recordingStore{ObjectStore: base}
	entries := []treeEntry{
		{path: ".", dir: true, mode: 0o750},
		{path: "checkpoint.img", mode: 0o644, content: "checkpoint header"},
		{path: "pages.img", mode: 0o600, content: string(mixedContent(3<<20+123, 1))},
		{path: "empty", mode: 0o644},
		{path: "setuid-tool", mode: 0o4755, content: "#!/bin/sh\n"},
		{path: "vol", dir: true, mode: 0o755},
		{path: "vol/data", dir: true, mode: 0o700},
		{path: "vol/data/state.db", mode: 0o640, content: strings.Repeat("row\n", 1000)},
		{path: "vol/data/secret", mode: 0o400, content: "read-only file"},
		{path: "vol/data/name with spaces & ünïcode", mode: 0o644, content: "odd name"},
		{path: "vol/readonly", dir: true, mode: 0o555},
		{path: "vol/readonly/f", mode: 0o444, content: "in a read-only dir"},
		{path: "vol/empty-dir", dir: true, mode: 0o711},
		{path: "vol/link", target: "data/state.db"},
		{path: "vol/dangling", target: "/nonexistent/elsewhere"},
	}
	src := t.TempDir()
	writeTree(t, src, entries)
	if os.Geteuid() == 0 {
		if err := os.Lchown(filepath.Join(src, "vol/data/state.db"), 1234, 5678); err != nil {
			t.Fatal(err)
		}
	}
	want := readTree(t, src)

	loc, err := Location("default", "actor-uid", "snap-uid")
	if err != nil {
		t.Fatal(err)
	}
	m, digest, size, err := Upload(ctx, store, loc, src)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Entries) != len(entries) {
		t.Errorf("manifest has %d entries, want %d", len(m.Entries), len(entries))
	}
	var contentBytes int64
	for _, e := range entries {
		contentBytes += int64(len(e.content))
	}
	if m.Size() != contentBytes {
		t.Errorf("manifest Size() = %d, want %d", m.Size(), contentBytes)
	}
	if m.StoredSize() >= m.Size() || size <= m.StoredSize() {
		t.Errorf("stored %d bytes (objects %d) for %d bytes of content: not compressed or size excludes the manifest", size, m.StoredSize(), m.Size())
	}
	ops := store.opsLog()
	if last := ops[len(ops)-1]; last != "put "+loc+"/manifest.json" {
		t.Errorf("last store operation = %q, want the manifest put", last)
	}

	dest := filepath.Join(t.TempDir(), "restored")
	if err := Download(ctx, store, loc, digest, dest); err != nil {
		t.Fatal(err)
	}
	got := readTree(t, dest)
	if os.Geteuid() != 0 {
		// Ownership is only restored as root; compare the rest.
		for k, v := range want {
			v.uid, v.gid = got[k].uid, got[k].gid
			want[k] = v
		}
	}
	for p, w := range want {
		if g, ok := got[p]; !ok {
			t.Errorf("%s: missing after restore", p)
		} else if g != w {
			t.Errorf("%s: restored as %+v, want %+v", p, short(g), short(w))
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: restored but not in the source", p)
		}
	}
	if !maps.EqualFunc(got, want, func(a, b treeState) bool { return a == b }) {
		t.Error("restored tree differs from the source")
	}
}

// short keeps failure messages readable when content is megabytes.
func short(s treeState) treeState {
	if len(s.content) > 40 {
		s.content = s.content[:40] + "…"
	}
	return s
}

func TestDownloadDataLoss(t *testing.T) {
	const loc = "default/actor/snap"
	// rewriteObject changes the first chunk of file.
	rewriteObject := func(t *testing.T, s *DirStore, m *Manifest, file string, change func([]byte) []byte) {
		t.Helper()
		for _, e := range m.Entries {
			if e.Path == file {
				p := objectPath(s, e.Chunks[0].Key())
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, change(b), 0o600); err != nil {
					t.Fatal(err)
				}
				return
			}
		}
		t.Fatalf("no file %s in manifest", file)
	}
	forgeManifest := func(t *testing.T, s *DirStore, m *Manifest) string {
		t.Helper()
		body, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(objectPath(s, manifestKey(loc)), body, 0o600); err != nil {
			t.Fatal(err)
		}
		return digestOf(body)
	}

	tests := []struct {
		name string
		// tamper damages the stored snapshot and returns the digest the
		// record would carry.
		tamper       func(t *testing.T, s *DirStore, m *Manifest, digest string) string
		wantInError  string
		wantNotFound bool
		// wantChunkOf: the error names the first chunk of this file.
		wantChunkOf string
	}{
		{
			name: "flipped byte in object",
			tamper: func(t *testing.T, s *DirStore, m *Manifest, digest string) string {
				rewriteObject(t, s, m, "pages.img", func(b []byte) []byte { b[len(b)/2] ^= 0x40; return b })
				return digest
			},
			wantInError: "file pages.img: chunk ",
			wantChunkOf: "pages.img",
		},
		{
			name: "truncated object",
			tamper: func(t *testing.T, s *DirStore, m *Manifest, digest string) string {
				rewriteObject(t, s, m, "vol/state.db", func(b []byte) []byte { return b[:len(b)/2] })
				return digest
			},
			wantInError: "file vol/state.db: chunk ",
			wantChunkOf: "vol/state.db",
		},
		{
			name: "object replaced by other valid data",
			tamper: func(t *testing.T, s *DirStore, m *Manifest, digest string) string {
				rewriteObject(t, s, m, "pages.img", func([]byte) []byte {
					enc, _ := zstd.NewWriter(nil)
					return enc.EncodeAll([]byte("other content"), nil)
				})
				return digest
			},
			wantInError: "file pages.img: chunk ",
			wantChunkOf: "pages.img",
		},
		{
			name: "object replaced by a chunk of the same size",
			tamper: func(t *testing.T, s *DirStore, m *Manifest, digest string) string {
				rewriteObject(t, s, m, "vol/state.db", func([]byte) []byte {
					return chunkEncoder().EncodeAll([]byte(strings.Repeat("stat! ", 5000)), nil)
				})
				return digest
			},
			wantInError: "sha256 mismatch",
			wantChunkOf: "vol/state.db",
		},
		{
			name: "object missing",
			tamper: func(t *testing.T, s *DirStore, m *Manifest, digest string) string {
				if err := os.Remove(objectPath(s, m.Entries[len(m.Entries)-1].Chunks[0].Key())); err != nil {
					t.Fatal(err)
				}
				return digest
			},
			wantInError:  "file vol/state.db: chunk ",
			wantNotFound: true,
			wantChunkOf:  "vol/state.db",
		},
		{
			name: "manifest edited",
			tamper: func(t *testing.T, s *DirStore, m *Manifest, digest string) string {
				m.Entries[1].Mode = 0o777
				forgeManifest(t, s, m)
				return digest
			},
			wantInError: "manifest: digest mismatch",
		},
		{
			name: "manifest missing",
			tamper: func(t *testing.T, s *DirStore, m *Manifest, digest string) string {
				if err := os.Remove(objectPath(s, manifestKey(loc))); err != nil {
					t.Fatal(err)
				}
				return digest
			},
			wantInError:  "manifest:",
			wantNotFound: true,
		},
		{
			name: "record carries another digest",
			tamper: func(t *testing.T, s *DirStore, m *Manifest, digest string) string {
				return digestOf([]byte("another manifest"))
			},
			wantInError: "manifest: digest mismatch",
		},
		{
			name: "forged manifest escaping the destination",
			tamper: func(t *testing.T, s *DirStore, m *Manifest, digest string) string {
				m.Entries[1].Path = "../escaped"
				return forgeManifest(t, s, m)
			},
			wantInError: "file ../escaped: bad path",
		},
		{
			name: "forged manifest writing through a symlink",
			tamper: func(t *testing.T, s *DirStore, m *Manifest, digest string) string {
				m.Entries = append(m.Entries[:2:2], Entry{Path: "vol", Type: EntrySymlink, Target: "/tmp"}, m.Entries[3])
				return forgeManifest(t, s, m)
			},
			wantInError: "file vol/state.db: parent directory",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newDirStore(t)
			m, digest := mustUpload(t, s, loc, []treeEntry{
				{path: "pages.img", mode: 0o600, content: string(mixedContent(256<<10, 2))},
				{path: "vol", dir: true, mode: 0o755},
				{path: "vol/state.db", mode: 0o644, content: strings.Repeat("state ", 5000)},
			})
			digest = tt.tamper(t, s, m, digest)

			parent := t.TempDir()
			dest := filepath.Join(parent, "restored")
			err := Download(t.Context(), s, loc, digest, dest)
			if !errors.Is(err, ErrDataLoss) {
				t.Fatalf("Download = %v, want ErrDataLoss", err)
			}
			t.Logf("error: %v", err)
			if want := "snapshot " + loc + ": "; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("error %q does not start with %q", err, want)
			}
			if !strings.Contains(err.Error(), tt.wantInError) {
				t.Errorf("error %q does not contain %q", err, tt.wantInError)
			}
			if got := errors.Is(err, ErrNotFound); got != tt.wantNotFound {
				t.Errorf("errors.Is(err, ErrNotFound) = %v, want %v", got, tt.wantNotFound)
			}
			if tt.wantChunkOf != "" {
				var want string
				for _, e := range m.Entries {
					if e.Path == tt.wantChunkOf {
						want = e.Chunks[0].SHA256
					}
				}
				var lost *DataLossError
				if !errors.As(err, &lost) || lost.Chunk != want || !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name chunk %s", err, want)
				}
			}
			if names, _ := os.ReadDir(parent); len(names) != 0 {
				t.Errorf("failed download left %v in the destination's parent", names)
			}
			if _, err := os.Stat(filepath.Join(parent, "..", "escaped")); err == nil {
				t.Error("a forged manifest wrote outside the destination")
			}
		})
	}
}

func TestDownloadStoreFailureIsNotDataLoss(t *testing.T) {
	const loc = "default/actor/snap"
	base := newDirStore(t)
	_, digest := mustUpload(t, base, loc, simpleTree("content"))
	store := &recordingStore{ObjectStore: base, getErr: func(key string) error {
		if strings.HasPrefix(key, chunksDir+"/") {
			return errInjected
		}
		return nil
	}}
	parent := t.TempDir()
	err := Download(t.Context(), store, loc, digest, filepath.Join(parent, "d"))
	if err == nil || errors.Is(err, ErrDataLoss) || !errors.Is(err, errInjected) {
		t.Fatalf("Download with a failing store = %v, want the store error and not ErrDataLoss", err)
	}
	if !strings.Contains(err.Error(), "file pages.img") {
		t.Errorf("error %q does not name the file", err)
	}
	if names, _ := os.ReadDir(parent); len(names) != 0 {
		t.Errorf("failed download left %v behind", names)
	}
}

func TestDownloadDestination(t *testing.T) {
	const loc = "default/actor/snap"
	s := newDirStore(t)
	_, digest := mustUpload(t, s, loc, simpleTree("content"))

	t.Run("existing empty directory", func(t *testing.T) {
		dest := t.TempDir()
		if err := Download(t.Context(), s, loc, digest, dest); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(dest, "pages.img")); err != nil || string(b) != "content" {
			t.Errorf("restored pages.img = %q, %v", b, err)
		}
	})
	t.Run("non-empty directory", func(t *testing.T) {
		dest := t.TempDir()
		if err := os.WriteFile(filepath.Join(dest, "keep"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		err := Download(t.Context(), s, loc, digest, dest)
		if err == nil || !strings.Contains(err.Error(), "not empty") {
			t.Fatalf("Download into a non-empty directory = %v, want a 'not empty' error", err)
		}
		if names, _ := os.ReadDir(dest); len(names) != 1 {
			t.Errorf("destination changed: %v", names)
		}
	})
}

func TestUploadRefusesExistingSnapshot(t *testing.T) {
	const loc = "default/actor/snap"
	s := newDirStore(t)
	_, digest := mustUpload(t, s, loc, simpleTree("first"))
	src := t.TempDir()
	writeTree(t, src, simpleTree("second"))
	if _, _, _, err := Upload(t.Context(), s, loc, src); !errors.Is(err, ErrExists) {
		t.Fatalf("second Upload to %s = %v, want ErrExists", loc, err)
	}
	dest := filepath.Join(t.TempDir(), "d")
	if err := Download(t.Context(), s, loc, digest, dest); err != nil {
		t.Fatalf("the first snapshot was damaged: %v", err)
	}
}

func TestUploadRejectsBadInput(t *testing.T) {
	s := newDirStore(t)
	src := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(src, "a-pipe"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, location, src, want string
	}{
		{"special file", "default/a/s", src, "a-pipe: unsupported file type"},
		{"missing source", "default/a/s", filepath.Join(src, "nope"), "source directory"},
		{"location traversal", "default/../s", src, "invalid object key"},
		{"location too short", "default/a", src, "want <space>/<actor uid>/<snapshot uid>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, _, err := Upload(t.Context(), s, tt.location, tt.src)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Upload = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if objs, _ := s.List(t.Context(), ""); len(objs) != 0 {
		t.Errorf("rejected uploads stored %v", objs)
	}
}

func TestFailedUploadIsNeverVisible(t *testing.T) {
	const loc = "default/actor/snap"
	tree := []treeEntry{
		{path: "a", mode: 0o644, content: "aaaa"},
		{path: "b", mode: 0o644, content: "bbbb"},
		{path: "c", mode: 0o644, content: "cccc"},
	}
	tests := []struct {
		name  string
		crash bool
	}{
		// A chunked snapshot has nothing but its manifest in its
		// location, so even a writer that died leaves nothing there; the
		// chunks it put stay for SweepChunks.
		{"store error, cleaned up", false},
		{"writer crashed", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := newDirStore(t)
			store := &recordingStore{ObjectStore: base, failPut: 3, crash: tt.crash}
			src := t.TempDir()
			writeTree(t, src, tree)
			if _, _, _, err := Upload(t.Context(), store, loc, src); !errors.Is(err, errInjected) {
				t.Fatalf("Upload = %v, want the injected failure", err)
			}
			for _, op := range store.opsLog() {
				if op == "put "+manifestKey(loc) {
					t.Fatalf("manifest was written by a failed upload: %v", store.opsLog())
				}
			}
			objs, err := base.List(t.Context(), loc+"/")
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) > 0 {
				t.Errorf("objects in the location after a failed upload: %v", objs)
			}
			locs, err := ListLocations(t.Context(), base, "")
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range locs {
				if l.Complete {
					t.Errorf("location %s looks complete after a failed upload", l.Location)
				}
			}
			// Whatever digest a confused caller might hold, nothing restores.
			err = Download(t.Context(), base, loc, digestOf([]byte("{}")), filepath.Join(t.TempDir(), "d"))
			if !errors.Is(err, ErrDataLoss) || !errors.Is(err, ErrNotFound) {
				t.Errorf("Download of failed upload = %v, want ErrDataLoss and ErrNotFound", err)
			}
		})
	}
}

func TestLocation(t *testing.T) {
	tests := []struct {
		space, actor, snap string
		want               string
	}{
		{"default", "a1", "s1", "default/a1/s1"},
		{"default", "a/b", "s1", ""},
		{"", "a", "s", ""},
		{"default", "..", "s", ""},
	}
	for _, tt := range tests {
		got, err := Location(tt.space, tt.actor, tt.snap)
		if tt.want == "" {
			if err == nil {
				t.Errorf("Location(%q, %q, %q) = %q, want an error", tt.space, tt.actor, tt.snap, got)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Location(%q, %q, %q) = %q, %v; want %q", tt.space, tt.actor, tt.snap, got, err, tt.want)
			continue
		}
		sp, a, s, err := ParseLocation(got)
		if err != nil || sp != tt.space || a != tt.actor || s != tt.snap {
			t.Errorf("ParseLocation(%q) = %q, %q, %q, %v", got, sp, a, s, err)
		}
	}
}

func TestRoundTripEmptyTree(t *testing.T) {
	const loc = "default/actor/empty"
	s := newDirStore(t)
	m, digest := mustUpload(t, s, loc, nil)
	if len(m.Entries) != 1 || m.Size() != 0 {
		t.Errorf("manifest of an empty tree: %+v", m.Entries)
	}
	dest := filepath.Join(t.TempDir(), "d")
	if err := Download(t.Context(), s, loc, digest, dest); err != nil {
		t.Fatal(err)
	}
	if names, err := os.ReadDir(dest); err != nil || len(names) != 0 {
		t.Errorf("restored empty tree: %v, %v", names, err)
	}
}

// TestDownloadPart: a part of a snapshot restores alone, verified like
// the whole; a snapshot without the part restores nothing.
func TestDownloadPart(t *testing.T) {
	ctx := t.Context()
	store, err := NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	loc, err := Location("default", "actor-uid", "snap-uid")
	if err != nil {
		t.Fatal(err)
	}
	_, digest := mustUpload(t, store, loc, []treeEntry{
		{path: "memory", dir: true, mode: 0o700},
		{path: "memory/pages.img", mode: 0o600, content: "pages"},
		{path: "logs", dir: true, mode: 0o700},
		{path: "logs/current", mode: 0o600, content: "a record\n"},
		{path: "logsmore", mode: 0o600, content: "not in logs/"},
	})
	dest := t.TempDir()
	if err := DownloadPart(ctx, store, loc, digest, "logs", dest); err != nil {
		t.Fatal(err)
	}
	got := readTree(t, dest)
	if len(got) != 3 || got["logs/current"].content != "a record\n" {
		t.Fatalf("part restored %v, want logs/ alone", got)
	}
	if err := DownloadPart(ctx, store, loc, "sha256:"+strings.Repeat("0", 64), "logs", t.TempDir()); !errors.Is(err, ErrDataLoss) {
		t.Fatalf("part under a wrong digest: %v, want data loss", err)
	}
	empty := t.TempDir()
	if err := DownloadPart(ctx, store, loc, digest, "volumes", empty); err != nil {
		t.Fatal(err)
	}
	if got := readTree(t, empty); len(got) != 1 {
		t.Fatalf("a part the snapshot lacks restored %v", got)
	}
}
