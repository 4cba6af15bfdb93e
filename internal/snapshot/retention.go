package snapshot

import (
	"context"
	"errors"
	"fmt"
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
		if len(parts) <= segmentsLen {
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
// whole one. Deleting a missing snapshot is not an error.
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
