package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/torpor-dev/torpor/internal/runtime"
	"golang.org/x/sys/unix"
)

// Warm sandboxes (see the package comment): booted ahead of a workload,
// matched with it when it starts, and the bind mounts it brings then.

// warmFile marks a warm sandbox's bundle; it records what the spec does
// not: the root filesystem under the overlay.
const warmFile = "warm.json"

type warmRecord struct {
	Rootfs string `json:"rootfs"`
}

// warmSpec is the spec of w's first container in the warm sandbox whose
// bundle is dir: its bind mounts come from the bundle's mount points.
// Only the first container is made ahead: the others join the sandbox
// when it starts, their host directories in place by then.
func warmSpec(w runtime.Workload, containers []runtime.Checked, dir, netnsPath string) ([]byte, error) {
	c := containers[0]
	c.Mounts = slices.Clone(c.Mounts)
	for i := range c.Mounts {
		c.Mounts[i].Host = mountPoint(dir, i)
	}
	return specJSON(buildSpec(w, c, filepath.Join(dir, "rootfs"), netnsPath, annotations(containers, 0, filepath.Base(dir))))
}

// matches says whether the warm sandbox id of slot was made for w, or,
// for a restore (anyActor), for any actor of w's shape: the restore
// then sets the hostname (see hostname.go).
func (r *Runtime) matches(slot runtime.Slot, id string, w runtime.Workload, containers []runtime.Checked, anyActor bool) bool {
	dir := r.bundleDir(slot.Name, id)
	var rec warmRecord
	if err := readJSONFile(filepath.Join(dir, warmFile), &rec); err != nil || rec.Rootfs != containers[0].Rootfs {
		return false
	}
	have, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return false
	}
	if anyActor && canRename() {
		var spec ociSpec
		if err := json.Unmarshal(have, &spec); err != nil {
			return false
		}
		w.Actor = spec.Hostname
	}
	want, err := warmSpec(w, containers, dir, slot.NetNS)
	return err == nil && bytes.Equal(have, want)
}

// Warm implements runtime.Runtime.
func (r *Runtime) Warm(ctx context.Context, slot runtime.Slot, w runtime.Workload) error {
	if err := checkSlot(slot); err != nil {
		return fmt.Errorf("warm for actor %s: %w", w.ActorUID, err)
	}
	containers, err := w.CheckShape()
	if err != nil {
		return fmt.Errorf("slot %s: warm: %w", slot.Name, err)
	}
	defer r.lock(slot.Name)()
	active, warm, err := r.sandboxes(slot.Name)
	if err != nil {
		return err
	}
	if len(active) > 0 {
		return fmt.Errorf("slot %s: warm for actor %s: %w (sandbox %s)", slot.Name, w.ActorUID, runtime.ErrBusy, active[0])
	}
	if len(warm) == 1 && r.matches(slot, warm[0], w, containers, false) {
		return nil
	}
	for _, id := range warm {
		if err := r.remove(ctx, slot.Name, id); err != nil {
			return fmt.Errorf("slot %s: warm: replace the warm sandbox: %w", slot.Name, err)
		}
	}
	id, err := r.newID(slot.Name)
	if err != nil {
		return err
	}
	began := time.Now()
	if err := r.create(ctx, slot, w, containers, id); err != nil {
		cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commandTimeout)
		defer cancel()
		if rmErr := r.remove(cleanupCtx, slot.Name, id); rmErr != nil {
			r.log.Error("removing a warm sandbox that failed to start", "slot", slot.Name, "sandbox", id, "err", rmErr)
		}
		return fmt.Errorf("slot %s: warm for actor %s (%s/%s) as sandbox %s: %w", slot.Name, w.ActorUID, w.Space, w.Actor, id, err)
	}
	r.log.Debug("sandbox warm", "slot", slot.Name, "sandbox", id, "actor_uid", w.ActorUID, "took", time.Since(began))
	return nil
}

// create makes the warm sandbox id for w.
func (r *Runtime) create(ctx context.Context, slot runtime.Slot, w runtime.Workload, containers []runtime.Checked, id string) error {
	c := containers[0]
	dir := r.bundleDir(slot.Name, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// The marker goes first: whatever follows is undone by remove.
	rec, err := json.Marshal(warmRecord{Rootfs: c.Rootfs})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, warmFile), rec, 0o644); err != nil {
		return err
	}
	if _, err := prepareBundle(dir, c); err != nil {
		return err
	}
	for i := range c.Mounts {
		mp := mountPoint(dir, i)
		if err := os.MkdirAll(mp, 0o755); err != nil {
			return err
		}
		// Shared, so what is mounted here later reaches the gofer's copy
		// (runsc makes the gofer's mounts slaves of the host's).
		if err := unix.Mount(mp, mp, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mount point %s: %w", mp, err)
		}
		if err := unix.Mount("", mp, "", unix.MS_SHARED, ""); err != nil {
			return fmt.Errorf("mount point %s: make shared: %w", mp, err)
		}
	}
	spec, err := warmSpec(w, containers, dir, slot.NetNS)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), spec, 0o644); err != nil {
		return err
	}
	return r.detachedFor(ctx, slot, 0, dir, "create", "--bundle="+dir, id)
}

// activate starts w (imageDir empty) or restores it in the warm sandbox
// id: its host directories are mounted on the sandbox's mount points, then
// runsc starts or restores into the sandbox it made already.
func (r *Runtime) activate(ctx context.Context, slot runtime.Slot, w runtime.Workload, id string, containers []runtime.Checked, imageDir string) error {
	dir := r.bundleDir(slot.Name, id)
	for i, m := range containers[0].Mounts {
		if err := bindOnto(m, mountPoint(dir, i)); err != nil {
			return err
		}
	}
	// runsc run would create the sandbox again; start runs in it.
	args := []string{"start", id}
	if imageDir != "" {
		args = startArgs(dir, id, imageDir)
	}
	if err := r.detachedFor(ctx, slot, 0, dir, args...); err != nil {
		return err
	}
	if err := r.join(ctx, slot, w, containers, id, imageDir); err != nil {
		return err
	}
	var spec ociSpec
	if err := readJSONFile(filepath.Join(dir, "config.json"), &spec); err != nil {
		return err
	}
	if err := r.nameRestored(ctx, slot.Name, id, w.Actor, spec.Hostname, imageDir); err != nil {
		return err
	}
	return os.Rename(filepath.Join(dir, warmFile), filepath.Join(dir, startedWarmFile))
}

// startedWarmFile marks the bundle of a sandbox that was warm when its
// workload started (StartedWarm).
const startedWarmFile = "started-warm"

// StartedWarm reports whether slot's workload started in a sandbox made
// ahead (Warm).
func (r *Runtime) StartedWarm(slot runtime.Slot) bool {
	active, _, err := r.sandboxes(slot.Name)
	if err != nil || len(active) != 1 {
		return false
	}
	_, err = os.Stat(filepath.Join(r.bundleDir(slot.Name, active[0]), startedWarmFile))
	return err == nil
}

// bindOnto mounts m's host directory (recursively) at target, read-only if
// m is. The mount is made read-only before it is attached, as propagation
// copies it with its flags (a later read-only remount would not reach the
// gofer's copy).
func bindOnto(m runtime.BindMount, target string) error {
	if !m.ReadOnly {
		if err := unix.Mount(m.Host, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("mount %s at %s: %w", m.Host, target, err)
		}
		return nil
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, m.Host, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", m.Host, err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		return fmt.Errorf("make %s read-only: %w", m.Host, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount %s at %s: %w", m.Host, target, err)
	}
	return nil
}
