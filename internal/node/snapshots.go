package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

// A snapshot's tree on disk: the runtime's memory image (FULL captures
// only) and the durable volumes as one archive, kept apart so a DATA
// restore can take the volumes of a FULL capture.
const (
	memoryDir   = "memory"
	dataArchive = "data.tar"
)

// snapshots are where checkpoints go and restores start from: snapshot
// storage shared with the control plane, read through one cache on this
// node under one bound, and this node's local checkpoints (pauses), kept
// as their files (trees): a pause writes nothing that must leave the node
// and compresses nothing, and a resume from it reads the pages where the
// capture wrote them. A tree is sealed (synced and hashed) after the
// pause answers, to outlive a restart of the host. local holds the local checkpoints of earlier
// versions, kept as chunks, which still restore.
type snapshots struct {
	node    string
	log     *slog.Logger
	storage snapshot.ObjectStore
	cache   *snapshot.Cache
	trees   *snapshot.Trees
	local   *snapshot.DirStore
	// background runs work an agent's stop waits for: sealing kept
	// trees, off the path of the pause that kept them.
	background func(func())
	// stopping is closed when the agent stops: a seal waiting for its
	// time goes at once.
	stopping <-chan struct{}
}

// sealDelay is how long a local checkpoint waits to be sealed after the
// pause that kept it. A seal syncs hundreds of MB, and on ext4 (ordered
// data) that holds up every other sync on the filesystem meanwhile,
// among them the pause's own slot record and the control plane's commit
// of it: sealing at once made a pause of a 272 MB actor 70 ms longer.
const sealDelay = 2 * time.Second

// openSnapshots opens the cache and the local checkpoints in d, and
// seals (in the background) the local checkpoints a previous run kept
// but did not seal. ctx ends when the agent stops.
func openSnapshots(ctx context.Context, node string, log *slog.Logger, storage snapshot.ObjectStore, d dirs, cacheBytes int64, background func(func())) (*snapshots, error) {
	// Earlier versions cached local checkpoints apart, under a bound of
	// their own; a cache's entries do not outlive its process anyway.
	if err := os.RemoveAll(d.oldLocalCache); err != nil {
		return nil, fmt.Errorf("remove the old local checkpoint cache: %w", err)
	}
	sn := &snapshots{node: node, log: log, storage: storage, background: background, stopping: ctx.Done()}
	var err error
	if sn.cache, err = snapshot.NewCache(d.cache, cacheBytes, storage); err != nil {
		return nil, err
	}
	local, err := snapshot.NewDirStore(d.local)
	if err != nil {
		return nil, err
	}
	sn.local = local
	if sn.trees, err = snapshot.NewTrees(d.trees); err != nil {
		return nil, err
	}
	unsealed, err := sn.trees.Unsealed()
	if err != nil {
		return nil, err
	}
	for _, l := range unsealed {
		sn.background(func() { sn.seal(l) })
	}
	return sn, nil
}

// sealLater seals the local checkpoint at location in the background,
// sealDelay from now or at the agent's stop, whichever comes first.
func (sn *snapshots) sealLater(location string) {
	sn.background(func() {
		t := time.NewTimer(sealDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-sn.stopping:
		}
		sn.seal(location)
	})
}

// seal makes the local checkpoint at location outlive a restart of the
// host; until then a restart of the host loses it.
func (sn *snapshots) seal(location string) {
	if err := sn.trees.Seal(context.Background(), location); err != nil {
		sn.log.Warn("local checkpoint not sealed: a restart of the host before the next agent start seals it loses it", "location", location, "err", err)
	}
}

// store keeps the snapshot tree at location of target t: a local
// checkpoint as its files, anything else uploaded to snapshot storage.
// It returns the manifest digest and size to record, and whether the tree
// then belongs in the cache (for a restore on this node without a
// download): a kept tree is read where it is.
func (sn *snapshots) store(ctx context.Context, t torporv1.CheckpointTarget, location, tree string) (string, int64, bool, error) {
	if t == torporv1.CheckpointTarget_CHECKPOINT_TARGET_LOCAL {
		digest, size, err := sn.trees.Keep(ctx, location, tree)
		if err == nil {
			sn.sealLater(location)
		}
		return digest, size, false, err
	}
	digest, size, err := upload(ctx, sn.storage, location, tree)
	return digest, size, true, err
}

// dropLocal removes the actor's local checkpoints from this
// node: any start moves the actor past them (the control plane drops
// their records when the resume commits).
func (sn *snapshots) dropLocal(ctx context.Context, w *torporv1.Workload) {
	prefix := w.GetSpace() + "/" + w.GetActorUid()
	names, err := sn.trees.Locations(prefix)
	if err != nil {
		sn.log.Warn("local checkpoints not dropped", "actor_uid", w.GetActorUid(), "err", err)
		return
	}
	chunked, err := snapshot.ListLocations(ctx, sn.local, prefix)
	if err != nil {
		sn.log.Warn("local checkpoints not dropped", "actor_uid", w.GetActorUid(), "err", err)
		return
	}
	for _, l := range chunked {
		names = append(names, l.Location)
	}
	if err := sn.removeLocal(ctx, names...); err != nil {
		sn.log.Warn("local checkpoints not dropped", "actor_uid", w.GetActorUid(), "err", err)
	}
}

// removeLocal deletes the local checkpoints at locations (a missing one
// is not an error), then the chunks no remaining local checkpoint names.
// Callers pass only locations no operation of this node still writes or
// reads: an upload writes a location named for its own operation, and a
// restore reads one the control plane has not let go of.
func (sn *snapshots) removeLocal(ctx context.Context, locations ...string) error {
	var errs []error
	dropped := 0
	for _, l := range locations {
		if err := sn.trees.Delete(l); err != nil {
			errs = append(errs, fmt.Errorf("local checkpoint %s: %w", l, err))
			continue
		}
		if err := snapshot.DeleteSnapshot(ctx, sn.local, l); err != nil {
			errs = append(errs, fmt.Errorf("local checkpoint %s: %w", l, err))
			continue
		}
		dropped++
		sn.log.Debug("dropped local checkpoint", "location", l)
	}
	if dropped == 0 {
		return errors.Join(errs...)
	}
	// Nothing uploads to it any more (pauses keep trees), so its chunks
	// go with no grace.
	n, err := snapshot.SweepChunks(ctx, sn.local, 0)
	if err != nil {
		errs = append(errs, fmt.Errorf("sweep local checkpoint chunks: %w", err))
	} else {
		sn.log.Debug("swept local checkpoint chunks", "chunks", n)
	}
	return errors.Join(errs...)
}

// upload stores the tree at location. A location is named for one
// checkpoint operation, so a manifest already there is this operation's
// own earlier attempt, never referenced (the control plane records a
// snapshot only once this call answers): it is replaced.
func upload(ctx context.Context, objects snapshot.ObjectStore, location, tree string) (string, int64, error) {
	_, digest, size, err := snapshot.Upload(ctx, objects, location, tree)
	if errors.Is(err, snapshot.ErrExists) {
		if err := snapshot.DeleteSnapshot(ctx, objects, location); err != nil {
			return "", 0, fmt.Errorf("replace snapshot %s: %w", location, err)
		}
		_, digest, size, err = snapshot.Upload(ctx, objects, location, tree)
	}
	if err != nil {
		return "", 0, err
	}
	return digest, size, nil
}

// source fetches and verifies what a restore starts from. Its release
// tells whether the workload started: a start spends the actor's own
// snapshot, whose tree the cache then drops (the actor's next restore is
// of a newer snapshot; an explicit resume of this one downloads it
// again); the template's golden serves every new actor and stays.
func (sn *snapshots) source(ctx context.Context, req *torporv1.RestoreRequest) (bootSource, func(started bool), error) {
	var src bootSource
	var releases []func(started bool)
	release := func(started bool) {
		for _, r := range releases {
			r(started)
		}
	}
	fetch := func(field string, s *torporv1.SnapshotSource) (string, error) {
		dir, rel, err := sn.fetch(ctx, field, s)
		if passing(ctx, err) {
			op := req.GetOp()
			return "", unavailable(sn.log.With("worker", op.GetWorker(), "actor_uid", op.GetActorUid(), "operation", op.GetOperationId()), err)
		}
		if err != nil {
			return "", err
		}
		own := field != "golden"
		releases = append(releases, func(started bool) { rel(started && own) })
		return dir, nil
	}
	fail := func(err error) (bootSource, func(bool), error) {
		release(false)
		return bootSource{}, nil, err
	}
	if req.GetSnapshot() != nil {
		dir, err := fetch("snapshot", req.GetSnapshot())
		if err != nil {
			return fail(err)
		}
		if src.data, err = optional(filepath.Join(dir, dataArchive)); err != nil {
			return fail(err)
		}
		// A local checkpoint's log is this node's already, as new.
		if req.GetSnapshot().GetNode() == "" {
			src.logs = dir
		}
		if req.GetScope() == torporv1.RestoreScope_RESTORE_SCOPE_FULL {
			if src.memory, err = memoryImage("snapshot", req.GetSnapshot(), dir); err != nil {
				return fail(err)
			}
		}
	}
	if req.GetScope() == torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN {
		dir, err := fetch("golden", req.GetGolden())
		if err != nil {
			return fail(err)
		}
		if src.memory, err = memoryImage("golden", req.GetGolden(), dir); err != nil {
			return fail(err)
		}
		src.golden = true
	}
	return src, release, nil
}

// fetch returns a verified copy of a snapshot's tree from this node's
// cache, downloading it on a miss.
func (sn *snapshots) fetch(ctx context.Context, field string, src *torporv1.SnapshotSource) (string, snapshot.Release, error) {
	store := sn.storage
	switch src.GetNode() {
	case "":
	case sn.node:
		dir, err := sn.trees.Open(ctx, src.GetLocation(), src.GetManifestDigest())
		if err == nil {
			// Dropped with the local checkpoint's record, not by a
			// start (dropLocal).
			return dir, func(bool) {}, nil
		}
		if !errors.Is(err, snapshot.ErrNotFound) {
			return "", nil, sn.fetchFailed(field, err)
		}
		// An earlier version's local checkpoint, kept as chunks.
		store = sn.local
	default:
		return "", nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s: %s is a local checkpoint on node %s, not on this node %s", field, src.GetLocation(), src.GetNode(), sn.node)
	}
	dir, release, err := sn.cache.GetFrom(ctx, store, src.GetLocation(), src.GetManifestDigest())
	if err != nil {
		return "", nil, sn.fetchFailed(field, err)
	}
	return dir, release, nil
}

// fetchFailed is the error of a fetch of field: the snapshot package's
// errors name the snapshot and the file; data loss is of its kind.
func (sn *snapshots) fetchFailed(field string, err error) error {
	if field == "golden" {
		err = fmt.Errorf("golden %w", err)
	}
	if errors.Is(err, snapshot.ErrDataLoss) {
		return errdefs.Errorf(errdefs.ErrDataLoss, "%w", err)
	}
	return err
}

// memoryImage returns the memory image directory of a snapshot tree.
func memoryImage(field string, src *torporv1.SnapshotSource, tree string) (string, error) {
	dir := filepath.Join(tree, memoryDir)
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s: snapshot %s holds no memory image (a DATA snapshot cannot be restored FULL)", field, src.GetLocation())
		}
		return "", err
	}
	return dir, nil
}

// passing reports whether storing or fetching a snapshot failed for a
// fault that passes: of snapshot storage or the node's disk
// (snapshot.Transient), or a store that did not answer before the
// operation's deadline (its repeat has a deadline of its own).
func passing(ctx context.Context, err error) bool {
	return snapshot.Transient(err) || errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil
}

// unavailable answers an operation that met a fault that passes
// (passing): Unavailable is not recorded, so the control plane repeats
// the operation until it succeeds. A full disk waits for an operator to
// free space, so it is logged as an error (the interruption itself is
// logged by execute).
func unavailable(log *slog.Logger, err error) error {
	if snapshot.DiskFull(err) {
		log.Error("disk full: the operation is repeated until space is freed", "err", err)
	}
	return errdefs.Errorf(errdefs.ErrUnavailable, "%w", err)
}

// optional returns path if it exists, else "".
func optional(path string) (string, error) {
	switch _, err := os.Stat(path); {
	case err == nil:
		return path, nil
	case errors.Is(err, fs.ErrNotExist):
		return "", nil
	default:
		return "", err
	}
}
