package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	chunkers "github.com/PlakarKorp/go-cdc-chunkers"
	_ "github.com/PlakarKorp/go-cdc-chunkers/chunkers/jc" // registers chunkAlgorithm
	"github.com/klauspost/compress/zstd"
)

// Files of a version 2 snapshot are stored as content-addressed chunks
// shared by every snapshot of the store: a chunk the store already holds
// is not uploaded again. Boundaries are content-defined, not fixed
// offsets: gVisor's pages file holds only the pages present, so a few
// pages more or less early in memory shift everything after them, and
// fixed-size chunks would then all differ (measured on consecutive
// checkpoints of one Redis, docs/benchmarks.md).
//
// The cutter is JC (jump-based chunking on FastCDC's Gear hash): cutting
// is the one sequential step of an upload, and JC cuts ~3× faster than
// the Rabin fingerprints used before and ~1.7× faster than FastCDC, at
// the same sizes, deduplicating a 5% change as well (BenchmarkBigUpload).
// Snapshots cut otherwise still restore: a manifest lists its chunks,
// however they were cut.
const (
	chunksDir = "_chunks"
	// chunkMin..chunkMax around chunkNormal average about 720 KiB: the
	// sizes that deduplicated consecutive checkpoints best in the
	// measurement, at few enough objects per snapshot.
	chunkMin    = 256 << 10
	chunkNormal = 512 << 10
	chunkMax    = 4 << 20
	// chunkAlgorithm fixes the chunk boundaries: every writer must cut
	// the same content at the same places or nothing is shared. The
	// library keeps a registered name's boundaries stable.
	chunkAlgorithm = "jc-v1.0.0"
)

// Garbage collection of chunks races with uploads that reuse them: an
// upload decides a chunk exists and skips it, the chunk's last manifest
// is deleted, a sweep finds it unreferenced and deletes it, and then the
// upload writes a manifest naming it. Checking again does not help: the
// store has no conditional delete, so whatever a sweep checks, an upload
// may act between its check and its delete, and the reverse.
//
// Time closes it instead. A chunk's key carries the time its writer began
// to put it (Chunk.Written; the key is never written after that time plus
// the upload deadline). Then:
//
//   - an upload reuses a chunk only if it was written at most
//     ChunkReuseWindow before the upload started, and the upload writes
//     its manifest within UploadDeadline of starting or not at all;
//   - a sweep deletes a chunk only if no manifest listed after the sweep
//     read the clock names it, and it was written more than ChunkGrace =
//     ChunkReuseWindow + UploadDeadline + ClockSkew before that reading.
//
// Suppose an upload starting at s reuses a chunk written at w ≥ s−R and a
// sweep whose clock read L deletes it, so w < L−R−D−S. Then s < L−D−S:
// the upload's manifest, written by s+D, was in the store when the sweep
// listed manifests, and it names the chunk, so the sweep kept it. The
// same inequality shows the chunk was not deleted before s either. The
// argument needs the clocks of uploaders and sweeps within ClockSkew of
// each other and a strongly consistent List (S3 is; so is a directory).
//
// A store that one process alone writes (a node's local checkpoints) may
// instead exclude uploads while it sweeps, and sweep with no grace.
const (
	ChunkReuseWindow = 6 * time.Hour
	UploadDeadline   = time.Hour
	ClockSkew        = 10 * time.Minute
	ChunkGrace       = ChunkReuseWindow + UploadDeadline + ClockSkew
)

// Chunk is one piece of a file in a version 2 manifest; a file's chunks
// are listed in order and cover it exactly.
type Chunk struct {
	// SHA256 (hex) and Size of the uncompressed content.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	// Written names the stored object: when its writer began to put it,
	// in Unix seconds (see ChunkGrace).
	Written int64 `json:"written"`
	// StoredSize is the size of the zstd-compressed object.
	StoredSize int64 `json:"storedSize"`
}

// Key is where the chunk's object is in the store.
func (c Chunk) Key() string {
	return chunksDir + "/" + c.SHA256[:2] + "/" + c.SHA256 + "-" + strconv.FormatInt(c.Written, 10)
}

var chunkKeyRE = regexp.MustCompile(`^` + chunksDir + `/([0-9a-f]{2})/([0-9a-f]{64})-([0-9]{1,19})$`)

// parseChunkKey returns the hash and write time a chunk key names; ok is
// false for any other key, which chunk sweeps leave alone.
func parseChunkKey(key string) (sha string, written int64, ok bool) {
	m := chunkKeyRE.FindStringSubmatch(key)
	if m == nil || m[1] != m[2][:2] {
		return "", 0, false
	}
	written, err := strconv.ParseInt(m[3], 10, 64)
	return m[2], written, err == nil
}

func (c Chunk) validate() error {
	switch {
	case !isSHA256Hex(c.SHA256) || c.SHA256 != strings.ToLower(c.SHA256):
		return fmt.Errorf("chunk %q: malformed sha256", c.SHA256)
	case c.Size <= 0 || c.Size > chunkMax:
		return fmt.Errorf("chunk %s: size %d outside 1..%d", c.SHA256, c.Size, chunkMax)
	case c.StoredSize <= 0 || c.StoredSize > maxStoredChunk:
		return fmt.Errorf("chunk %s: stored size %d outside 1..%d", c.SHA256, c.StoredSize, maxStoredChunk)
	case c.Written <= 0:
		return fmt.Errorf("chunk %s: write time %d not positive", c.SHA256, c.Written)
	}
	return nil
}

// knownChunks are the chunks a process knows its store holds, by content
// hash: those it put and those the manifests it read name. An upload
// skips a chunk found here if it is recent enough (ChunkGrace).
type knownChunks struct {
	mu sync.Mutex
	m  map[string]Chunk
	// pruneAt is the size at which stale entries are next dropped.
	pruneAt int
}

// known holds one set per store: a chunk held by one store says nothing
// about another (a node's local checkpoints and snapshot storage).
var known sync.Map // ObjectStore → *knownChunks

func knownIn(store ObjectStore) *knownChunks {
	if k, ok := known.Load(store); ok {
		return k.(*knownChunks)
	}
	k, _ := known.LoadOrStore(store, &knownChunks{m: map[string]Chunk{}, pruneAt: 1024})
	return k.(*knownChunks)
}

// reusable returns the known chunk with content sha if an upload that
// started at start may name it without putting it.
func (k *knownChunks) reusable(sha string, start time.Time) (Chunk, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, ok := k.m[sha]
	return c, ok && c.Written >= ceilUnix(start.Add(-ChunkReuseWindow))
}

// ceilUnix is t in Unix seconds rounded up: for a whole number of
// seconds w, w >= ceilUnix(t) exactly when w is not before t, and
// w < ceilUnix(t) exactly when it is.
func ceilUnix(t time.Time) int64 {
	if t.Nanosecond() > 0 {
		return t.Unix() + 1
	}
	return t.Unix()
}

// add records chunks the store holds, keeping the newest copy of each.
func (k *knownChunks) add(chunks ...Chunk) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range chunks {
		if old, ok := k.m[c.SHA256]; !ok || old.Written < c.Written {
			k.m[c.SHA256] = c
		}
	}
	if len(k.m) >= k.pruneAt {
		stale := time.Now().Add(-ChunkReuseWindow).Unix()
		for sha, c := range k.m {
			if c.Written < stale {
				delete(k.m, sha)
			}
		}
		k.pruneAt = max(1024, 2*len(k.m))
	}
}

// forget drops a chunk found missing or corrupt, or deleted.
func (k *knownChunks) forget(c Chunk) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m[c.SHA256].Written == c.Written {
		delete(k.m, c.SHA256)
	}
}

func chunkSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Chunks are compressed and decompressed whole (EncodeAll/DecodeAll):
// they are small, and one shared coder of each kind serves every worker.
var (
	chunkEncoder = sync.OnceValue(func() *zstd.Encoder {
		e, err := zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)),
			zstd.WithWindowSize(chunkMax),
		)
		if err != nil {
			panic(fmt.Sprintf("zstd encoder with constant options: %v", err))
		}
		return e
	})
	chunkDecoder = sync.OnceValue(func() *zstd.Decoder {
		d, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)),
			// A forged frame cannot make a chunk's decoding allocate more
			// than a chunk.
			zstd.WithDecoderMaxMemory(chunkMax),
			zstd.WithDecoderMaxWindow(chunkMax),
		)
		if err != nil {
			panic(fmt.Sprintf("zstd decoder with constant options: %v", err))
		}
		return d
	})
)

// maxStoredChunk bounds a chunk's compressed object: zstd stores data it
// cannot shrink in raw blocks, a few bytes each per 128 KiB.
const maxStoredChunk = chunkMax + chunkMax>>7

// chunkBuffers hold one chunk each, compressed or not.
var chunkBuffers = sync.Pool{New: func() any { b := make([]byte, maxStoredChunk+1); return &b }}

// scanBuffers hold a file's bytes ahead of the next cut: twice the
// largest chunk, so that reads are large and the chunker rarely has to
// move what is left of the buffer to its start (four times measured no
// faster).
var scanBuffers = sync.Pool{New: func() any { b := make([]byte, 2*chunkMax); return &b }}

// newChunker cuts r into chunks, reading ahead into scan.
func newChunker(r io.Reader, scan []byte) (*chunkers.Chunker, error) {
	return chunkers.NewChunkerBuffer(chunkAlgorithm, r, &chunkers.ChunkerOpts{
		MinSize: chunkMin, NormalSize: chunkNormal, MaxSize: chunkMax,
	}, scan)
}

// transferWorkers bounds the chunks in flight: enough to keep a remote
// store busy while the CPUs compress or decompress, each holding at most
// two chunk buffers.
func transferWorkers() int { return max(8, 2*runtime.GOMAXPROCS(0)) }
