// Package snapshot stores actor snapshots (a checkpoint's files) in an
// object store and brings them back, verified.
//
// A snapshot lives under one location, <space>/<actor uid>/<snapshot uid>:
// one zstd-compressed object per file plus a manifest.json that lists every
// entry with the sha256 of its content and of its stored object. The
// manifest is written last and deleted first, so a snapshot whose manifest
// is present is complete; the record that points at a snapshot carries the
// manifest's digest, so a restore detects any change and fails with
// ErrDataLoss instead of running on corrupt state.
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

var (
	// ErrNotFound: the object store has no object under the key.
	ErrNotFound = errors.New("object not found")
	// ErrInvalidKey: a key or location that could escape its namespace or
	// is not a plain slash path.
	ErrInvalidKey = errors.New("invalid object key")
	// ErrExists: an upload would overwrite a snapshot that already has a
	// manifest.
	ErrExists = errors.New("snapshot already exists")
	// ErrDataLoss: a snapshot is missing, incomplete or corrupt. Restoring
	// from it must not proceed.
	ErrDataLoss = errdefs.New(errdefs.ErrDataLoss, "snapshot data loss")
)

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// ObjectStore is the little snapshot storage needs from a blob store; it
// maps onto a local directory as well as onto S3-compatible storage.
type ObjectStore interface {
	// Put stores the whole of r under key, replacing any object there.
	// Readers never see a partly written object.
	Put(ctx context.Context, key string, r io.Reader) error
	// Get opens the object under key; an error matching ErrNotFound when
	// there is none.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Delete removes the object under key; deleting a missing object is
	// not an error.
	Delete(ctx context.Context, key string) error
	// List returns the objects whose keys start with prefix (a plain
	// string prefix, as in S3), sorted by key.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
}

// ValidateKey accepts relative slash paths whose segments are non-empty and
// neither "." nor "..", so a key can never address anything outside the
// store's namespace, whatever the backend.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if strings.HasPrefix(key, "/") {
		return fmt.Errorf("%w %q: absolute path", ErrInvalidKey, key)
	}
	if strings.ContainsAny(key, "\x00\\") {
		return fmt.Errorf("%w %q: contains NUL or backslash", ErrInvalidKey, key)
	}
	for seg := range strings.SplitSeq(key, "/") {
		switch seg {
		case "":
			return fmt.Errorf("%w %q: empty path segment", ErrInvalidKey, key)
		case ".", "..":
			return fmt.Errorf("%w %q: %q segment", ErrInvalidKey, key, seg)
		}
	}
	return nil
}
