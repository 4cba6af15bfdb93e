package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// LocationInfo summarises what the store holds for one snapshot location.
type LocationInfo struct {
	Location string
	// Complete: the manifest is present (the upload finished and the
	// snapshot has not started being deleted).
	Complete bool
	Objects  int
	Bytes    int64
	// LastModified is the newest object's time; for a complete snapshot,
	// when its manifest was written.
	LastModified time.Time
}

// ListLocations lists the snapshot locations under prefix, a location
// prefix of whole segments: "" for all, a space, or space/actor uid.
func ListLocations(ctx context.Context, store ObjectStore, prefix string) ([]LocationInfo, error) {
	keyPrefix, err := locationPrefix(prefix)
	if err != nil {
		return nil, err
	}
	objects, err := store.List(ctx, keyPrefix)
	if err != nil {
		return nil, fmt.Errorf("list snapshots under %q: %w", prefix, err)
	}
	var out []LocationInfo
	// List is sorted by key, so one location's objects are adjacent.
	for _, o := range objects {
		parts := strings.SplitN(o.Key, "/", segmentsLen+1)
		if len(parts) <= segmentsLen || parts[0] == chunksDir {
			continue // not inside a snapshot location
		}
		loc := strings.Join(parts[:segmentsLen], "/")
		if len(out) == 0 || out[len(out)-1].Location != loc {
			out = append(out, LocationInfo{Location: loc})
		}
		info := &out[len(out)-1]
		info.Objects++
		info.Bytes += o.Size
		info.Complete = info.Complete || parts[segmentsLen] == manifestName
		if o.ModTime.After(info.LastModified) {
			info.LastModified = o.ModTime
		}
	}
	return out, nil
}

// DeleteSnapshot removes every object of the snapshot at location. The
// manifest goes first, so a partly deleted snapshot is never taken for a
// whole one. Deleting a missing snapshot is not an error. Chunks are
// shared between snapshots and stay for SweepChunks.
func DeleteSnapshot(ctx context.Context, store ObjectStore, location string) error {
	if _, _, _, err := ParseLocation(location); err != nil {
		return err
	}
	if err := store.Delete(ctx, manifestKey(location)); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", location, err)
	}
	objects, err := store.List(ctx, location+"/")
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", location, err)
	}
	for _, o := range objects {
		if err := store.Delete(ctx, o.Key); err != nil {
			return fmt.Errorf("delete snapshot %s: %w", location, err)
		}
	}
	return nil
}

// SweepOrphans deletes snapshot locations that no record references and
// returns the ones it deleted. Locations written to within minAge are
// kept: an upload in progress, or one whose record is not committed yet,
// has no reference. minAge must therefore exceed the longest time from an
// upload's start to its record's commit. isReferenced must read the
// authoritative store. Errors on one location do not stop the others.
func SweepOrphans(ctx context.Context, store ObjectStore, isReferenced func(ctx context.Context, location string) (bool, error), minAge time.Duration) ([]string, error) {
	locations, err := ListLocations(ctx, store, "")
	if err != nil {
		return nil, fmt.Errorf("sweep snapshots: %w", err)
	}
	cutoff := time.Now().Add(-minAge)
	var deleted []string
	var errs []error
	for _, l := range locations {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("sweep snapshots: %w", err))
			break
		}
		if l.LastModified.After(cutoff) {
			continue
		}
		referenced, err := isReferenced(ctx, l.Location)
		if err != nil {
			errs = append(errs, fmt.Errorf("sweep snapshot %s: %w", l.Location, err))
			continue
		}
		if referenced {
			continue
		}
		if err := DeleteSnapshot(ctx, store, l.Location); err != nil {
			errs = append(errs, fmt.Errorf("sweep: %w", err))
			continue
		}
		deleted = append(deleted, l.Location)
	}
	return deleted, errors.Join(errs...)
}

// SweepChunks deletes the chunks no snapshot manifest names that were
// written more than minAge ago, and returns how many it deleted. minAge
// must be at least ChunkGrace where uploads to store may run during the
// sweep (chunks.go argues why that is safe); a process that alone writes
// store and holds its uploads off while it sweeps may pass 0. A manifest
// that cannot be read stops the sweep before anything is deleted: the
// chunks it names are unknown.
func SweepChunks(ctx context.Context, store ObjectStore, minAge time.Duration) (int, error) {
	// Read before manifests are listed: a manifest written before this
	// instant is listed.
	cutoff := ceilUnix(time.Now().Add(-minAge))
	objects, err := store.List(ctx, chunksDir+"/")
	if err != nil {
		return 0, fmt.Errorf("sweep chunks: %w", err)
	}
	var old []Chunk
	for _, o := range objects {
		if sha, written, ok := parseChunkKey(o.Key); ok && written < cutoff {
			old = append(old, Chunk{SHA256: sha, Written: written})
		}
	}
	if len(old) == 0 {
		return 0, nil
	}
	named, err := namedChunks(ctx, store)
	if err != nil {
		return 0, fmt.Errorf("sweep chunks: %w", err)
	}
	k := knownIn(store)
	deleted := 0
	var errs []error
	for _, c := range old {
		if named[c.Key()] {
			continue
		}
		// Forgotten first: an upload of this process must not name it
		// once it may be gone.
		k.forget(c)
		if err := store.Delete(ctx, c.Key()); err != nil {
			errs = append(errs, fmt.Errorf("sweep chunks: %w", err))
			continue
		}
		deleted++
	}
	return deleted, errors.Join(errs...)
}

// namedChunks reads every manifest in store and returns the keys of the
// chunks they name.
func namedChunks(ctx context.Context, store ObjectStore) (map[string]bool, error) {
	locations, err := ListLocations(ctx, store, "")
	if err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, l := range locations {
		if !l.Complete {
			continue
		}
		m, err := readManifestUnchecked(ctx, store, l.Location)
		if errors.Is(err, ErrNotFound) {
			continue // deleted since it was listed
		}
		if err != nil {
			return nil, err
		}
		for _, e := range m.Entries {
			for _, c := range e.Chunks {
				if err := c.validate(); err != nil {
					return nil, fmt.Errorf("snapshot %s: manifest: %w", l.Location, err)
				}
				named[c.Key()] = true
			}
		}
	}
	return named, nil
}

// readManifestUnchecked reads a manifest without a record's digest to
// check it against: for what it names, not to restore from.
func readManifestUnchecked(ctx context.Context, store ObjectStore, location string) (*Manifest, error) {
	rc, err := store.Get(ctx, manifestKey(location))
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: manifest: %w", location, err)
	}
	defer rc.Close()
	var m Manifest
	if err := json.NewDecoder(io.LimitReader(rc, maxManifestBytes)).Decode(&m); err != nil {
		return nil, fmt.Errorf("snapshot %s: manifest: %w", location, err)
	}
	return &m, nil
}
