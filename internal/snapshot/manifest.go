package snapshot

import (
	"encoding/hex"
	"fmt"
	"path"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

const (
	// Version 1: one object per file under the location (files/N.zst).
	// Version 2, written now: files as content-addressed chunks shared by
	// the store's snapshots (chunks.go). Both download.
	manifestWholeFiles = 1
	manifestChunked    = 2
	// Version 3: a tree kept on this host as its files (Trees); never
	// uploaded.
	manifestTree    = 3
	compressionZstd = "zstd"
	compressionNone = "none"
	// maxManifestBytes bounds what Download reads before checking the
	// digest; a real manifest is a few hundred bytes per file.
	maxManifestBytes = 64 << 20
	// rootPath names the snapshot's top directory in the manifest.
	rootPath = "."
)

// Manifest lists everything in a snapshot. It is stored as manifest.json
// and written after every object it names.
type Manifest struct {
	Version     int    `json:"version"`
	Location    string `json:"location"`
	Compression string `json:"compression"`
	// Boot is the host's boot id when a kept tree (version 3) was kept.
	Boot string `json:"boot,omitempty"`
	// Entries in walk order: "." first, every directory before what it
	// contains.
	Entries []Entry `json:"entries"`
}

// EntryType is what kind of filesystem object an entry restores to.
type EntryType string

const (
	EntryDir     EntryType = "dir"
	EntryFile    EntryType = "file"
	EntrySymlink EntryType = "symlink"
)

// Entry is one directory, regular file or symlink of a snapshot.
type Entry struct {
	// Slash path relative to the snapshot root; "." is the root itself.
	Path string    `json:"path"`
	Type EntryType `json:"type"`
	// Permission bits including setuid, setgid and sticky (07777).
	Mode    uint32    `json:"mode"`
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	ModTime time.Time `json:"mtime"`

	// Files: uncompressed size.
	Size int64 `json:"size,omitempty"`
	// Version 2 files: the chunks, in order, that make the content.
	Chunks []Chunk `json:"chunks,omitempty"`

	// Version 1 files: the content's sha256 (hex), and the stored object
	// (key relative to the location) with its size and sha256.
	SHA256       string `json:"sha256,omitempty"`
	Object       string `json:"object,omitempty"`
	ObjectSize   int64  `json:"objectSize,omitempty"`
	ObjectSHA256 string `json:"objectSha256,omitempty"`

	// Symlinks: the link target, verbatim.
	Target string `json:"target,omitempty"`
}

// Size is the total uncompressed size of the snapshot's files.
func (m *Manifest) Size() int64 {
	var n int64
	for _, e := range m.Entries {
		n += e.Size
	}
	return n
}

// StoredSize is the total size of the snapshot's file objects, counting
// a chunk every time a file names it, whoever else shares it.
func (m *Manifest) StoredSize() int64 {
	var n int64
	for _, e := range m.Entries {
		n += e.ObjectSize
		for _, c := range e.Chunks {
			n += c.StoredSize
		}
	}
	return n
}

// validate checks a manifest before anything is written from it. Its
// digest already matched, so a failure here means a writer bug or a forged
// record; either way nothing outside the destination may be touched.
func (m *Manifest) validate(location string) error {
	if m.Version != manifestWholeFiles && m.Version != manifestChunked {
		return &DataLossError{Location: location, Err: fmt.Errorf("unsupported manifest version %d", m.Version)}
	}
	if m.Compression != compressionZstd {
		return &DataLossError{Location: location, Err: fmt.Errorf("unsupported compression %q", m.Compression)}
	}
	return m.validateEntries(location)
}

// validateAs checks a tree's manifest (Trees) as validate checks a
// stored snapshot's.
func (m *Manifest) validateAs(location string, version int) error {
	if m.Version != version || m.Compression != compressionNone || m.Boot == "" {
		return &DataLossError{Location: location, Err: fmt.Errorf("manifest version %d, compression %q: not a kept tree's", m.Version, m.Compression)}
	}
	return m.validateEntries(location)
}

func (m *Manifest) validateEntries(location string) error {
	if m.Location != location {
		return &DataLossError{Location: location, Err: fmt.Errorf("manifest is for location %q", m.Location)}
	}
	if len(m.Entries) == 0 || m.Entries[0].Path != rootPath || m.Entries[0].Type != EntryDir {
		return &DataLossError{Location: location, Err: fmt.Errorf("first entry is not the root directory")}
	}
	types := make(map[string]EntryType, len(m.Entries))
	for i, e := range m.Entries {
		if err := e.validate(location, m.Version, i == 0, types); err != nil {
			return &DataLossError{Location: location, File: e.Path, Err: err}
		}
		types[e.Path] = e.Type
	}
	return nil
}

func (e *Entry) validate(location string, version int, isRoot bool, seen map[string]EntryType) error {
	if !isRoot {
		if err := ValidateKey(e.Path); err != nil {
			return fmt.Errorf("bad path: %w", err)
		}
		if _, dup := seen[e.Path]; dup {
			return fmt.Errorf("listed twice")
		}
		if seen[path.Dir(e.Path)] != EntryDir {
			return fmt.Errorf("parent directory is not listed before it")
		}
	}
	if e.Mode&^0o7777 != 0 {
		return fmt.Errorf("mode %o has bits outside 07777", e.Mode)
	}
	switch e.Type {
	case EntryDir:
	case EntryFile:
		switch version {
		case manifestChunked:
			return e.validateChunks()
		case manifestTree:
			if len(e.Chunks) > 0 || e.Object != "" || e.SHA256 != "" || e.Size < 0 {
				return fmt.Errorf("not a kept tree's file: chunks, an object, a digest or a negative size")
			}
			return nil
		}
		if len(e.Chunks) > 0 {
			return fmt.Errorf("chunks in a version %d manifest", version)
		}
		if e.Size < 0 || e.ObjectSize < 0 {
			return fmt.Errorf("negative size")
		}
		if !isSHA256Hex(e.SHA256) || !isSHA256Hex(e.ObjectSHA256) {
			return fmt.Errorf("malformed sha256")
		}
		if err := ValidateKey(location + "/" + e.Object); err != nil {
			return fmt.Errorf("bad object key %q", e.Object)
		}
	case EntrySymlink:
		if e.Target == "" {
			return fmt.Errorf("symlink without target")
		}
	default:
		return fmt.Errorf("unknown entry type %q", e.Type)
	}
	return nil
}

func (e *Entry) validateChunks() error {
	if e.Object != "" || e.SHA256 != "" || e.ObjectSize != 0 || e.ObjectSHA256 != "" {
		return fmt.Errorf("a whole-file object in a chunked manifest")
	}
	var n int64
	for _, c := range e.Chunks {
		if err := c.validate(); err != nil {
			return err
		}
		n += c.Size
	}
	if n != e.Size {
		return fmt.Errorf("chunks hold %d bytes, the file %d", n, e.Size)
	}
	return nil
}

func isSHA256Hex(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == 32
}

// DataLossError reports a snapshot that cannot be restored as recorded: a
// missing or changed manifest or object, or content that does not decode
// or match its digest. errors.Is(err, ErrDataLoss) holds for it; the cause
// stays reachable (errors.Is(err, ErrNotFound) for a missing object).
type DataLossError struct {
	Location string
	// File is the snapshot path concerned; empty for the manifest.
	File string
	// Chunk is the sha256 of the chunk concerned, if one is.
	Chunk string
	Err   error
}

func (e *DataLossError) Error() string {
	switch {
	case e.File == "":
		return fmt.Sprintf("snapshot %s: manifest: %v", e.Location, e.Err)
	case e.Chunk != "":
		return fmt.Sprintf("snapshot %s: file %s: chunk %s: %v", e.Location, e.File, e.Chunk, e.Err)
	}
	return fmt.Sprintf("snapshot %s: file %s: %v", e.Location, e.File, e.Err)
}

func (e *DataLossError) Is(target error) bool {
	return target == ErrDataLoss || target == errdefs.ErrDataLoss
}

func (e *DataLossError) Unwrap() error { return e.Err }
