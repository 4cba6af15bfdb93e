package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/retry"
	"github.com/torpor-dev/torpor/internal/runtime"
	"golang.org/x/sys/unix"
)

// Removing sandboxes, whatever state they were left in: a slot vacated,
// a sandbox deleted with its bundle (never a volume still mounted in it),
// records a crash tore, and processes of a bundle runsc no longer knows.

// discard removes warm sandboxes of slot in the background; wait waits
// for that and returns its error.
func (r *Runtime) discard(ctx context.Context, slot string, ids []string) (wait func() error) {
	if len(ids) == 0 {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commandTimeout)
		defer cancel()
		var errs []error
		for _, id := range ids {
			r.log.Debug("discarding a warm sandbox made for another workload", "slot", slot, "sandbox", id)
			errs = append(errs, r.remove(ctx, slot, id))
		}
		done <- errors.Join(errs...)
	}()
	return func() error {
		if err := <-done; err != nil {
			return fmt.Errorf("discard warm sandbox: %w", err)
		}
		return nil
	}
}

// removeCleanly is remove with a deadline of its own.
func (r *Runtime) removeCleanly(ctx context.Context, slot, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commandTimeout)
	defer cancel()
	return r.remove(ctx, slot, id)
}

// vacate gives an emptied slot its address back in the host kernel, so a
// client still holding the address (a router's cached endpoint) is refused
// at once instead of waiting on a dial to nobody. A slot given by name
// only, or whose namespace is already gone, is left as it is.
func (r *Runtime) vacate(ctx context.Context, slot runtime.Slot) error {
	if slot.IP == "" || slot.NetNS == "" {
		return nil
	}
	if _, err := os.Stat(slot.NetNS); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := r.configureNetwork(ctx, slot); err != nil {
		return fmt.Errorf("slot %s: restore its address after the sandbox left: %w", slot.Name, err)
	}
	return nil
}

// Terminate implements runtime.Runtime. Only slot.Name is needed.
func (r *Runtime) Terminate(ctx context.Context, slot runtime.Slot) error {
	if err := checkSlotName(slot.Name); err != nil {
		return fmt.Errorf("terminate: %w", err)
	}
	defer r.lock(slot.Name)()
	ids, err := r.bundles(slot.Name)
	if err != nil {
		return err
	}
	// runsc may know sandboxes whose bundle is gone (removed by hand, or
	// a crash of an older version); they go too.
	known, err := r.containers(ctx)
	if err != nil {
		return fmt.Errorf("slot %s: terminate: %w", slot.Name, err)
	}
	for _, id := range known {
		if slotOf(id) == slot.Name && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	var errs []error
	for _, id := range ids {
		errs = append(errs, r.remove(ctx, slot.Name, id))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("slot %s: terminate: %w", slot.Name, err)
	}
	if err := os.Remove(filepath.Join(r.slotsDir, slot.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("slot %s: terminate: %w", slot.Name, err)
	}
	return r.vacate(ctx, slot)
}

// remove deletes sandbox id of slot with everything it made. Idempotent.
func (r *Runtime) remove(ctx context.Context, slot, id string) error {
	dir := r.bundleDir(slot, id)
	if !r.recorded(id, id) {
		// runsc never recorded the sandbox, or died writing its record:
		// the command starting it died (with its node agent) after forking
		// the sandbox and gofer, which runsc delete cannot reach.
		if err := killBundleProcesses(ctx, dir); err != nil {
			return fmt.Errorf("delete sandbox %s: %w", id, err)
		}
		// The killed sandbox leaves its control socket.
		if err := os.Remove(r.socket(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("delete sandbox %s: %w", id, err)
		}
	}
	if err := r.dropTornRecords(id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	// The containers that joined the sandbox go first, while it can
	// still be asked to stop them; runsc keeps their state apart from the
	// sandbox's.
	subs, _ := filepath.Glob(filepath.Join(dir, "containers", "*"))
	for _, sub := range subs {
		if err := r.delete(ctx, subID(id, filepath.Base(sub))); err != nil {
			return fmt.Errorf("delete sandbox %s: %w", id, err)
		}
	}
	if err := r.delete(ctx, id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	// A warm sandbox's mount points may hold a workload's volumes: they
	// must be unmounted and empty before anything is removed, or RemoveAll
	// would delete the volumes' data.
	points, _ := filepath.Glob(filepath.Join(dir, "mnt", "*"))
	for _, mp := range points {
		for unix.Unmount(mp, unix.MNT_DETACH) == nil {
		}
		if err := os.Remove(mp); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove bundle of sandbox %s: mount point: %w", id, err)
		}
	}
	for _, bundle := range append(subs, dir) {
		rootfs := filepath.Join(bundle, "rootfs")
		for unix.Unmount(rootfs, unix.MNT_DETACH) == nil {
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove bundle of sandbox %s: %w", id, err)
	}
	return nil
}

// recorded says whether runsc holds a complete record of container id of
// sandbox sandboxID.
func (r *Runtime) recorded(id, sandboxID string) bool {
	b, err := os.ReadFile(r.stateFile(id, sandboxID))
	return err == nil && json.Valid(b)
}

// dropTornRecords removes the records of sandbox sandboxID's containers
// that runsc began but never finished writing (it truncates, then writes
// them in place, and its command died in between): runsc fails on such an
// id for good, delete included. Their processes are the bundle's, killed
// by then, or the sandbox's, which its own deletion stops.
func (r *Runtime) dropTornRecords(sandboxID string) error {
	states, err := filepath.Glob(filepath.Join(r.runscDir, "*_sandbox:"+sandboxID+".state"))
	if err != nil {
		return err
	}
	for _, state := range states {
		id := strings.TrimSuffix(filepath.Base(state), "_sandbox:"+sandboxID+".state")
		if r.recorded(id, sandboxID) {
			continue
		}
		for _, f := range []string{state, strings.TrimSuffix(state, ".state") + ".lock"} {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove the torn runsc record of container %s: %w", id, err)
			}
		}
	}
	return nil
}

// killBundleProcesses kills the processes started for the bundle at dir
// and waits until they are gone.
func killBundleProcesses(ctx context.Context, dir string) error {
	var killed []string
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !forBundle(e.Name(), dir) {
			continue
		}
		if err := unix.Kill(pid, unix.SIGKILL); err == nil {
			killed = append(killed, e.Name())
		}
	}
	poll := retry.Policy{Initial: 5 * time.Millisecond, Max: 100 * time.Millisecond}.Start()
	for _, pid := range killed {
		for forBundle(pid, dir) {
			if !poll.Wait(ctx) {
				return fmt.Errorf("process %s of bundle %s did not exit: %w", pid, dir, context.Cause(ctx))
			}
		}
	}
	return nil
}

// forBundle says whether process pid runs for the bundle at dir (runsc's
// sandbox and gofer name it in their arguments). A process that exited
// has no arguments left.
func forBundle(pid, dir string) bool {
	cmdline, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	if err != nil {
		return false
	}
	for arg := range bytes.SplitSeq(cmdline, []byte{0}) {
		if string(arg) == dir || string(arg) == "--bundle="+dir {
			return true
		}
	}
	return false
}

// Sandboxes implements runtime.Runtime: the slots with a bundle or a
// container runsc knows.
func (r *Runtime) Sandboxes(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(r.slotsDir)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: %w", err)
	}
	var slots []string
	for _, e := range entries {
		if ids, err := r.bundles(e.Name()); err == nil && len(ids) > 0 {
			slots = append(slots, e.Name())
		}
	}
	known, err := r.containers(ctx)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: %w", err)
	}
	for _, id := range known {
		if s := slotOf(id); s != "" && !slices.Contains(slots, s) {
			slots = append(slots, s)
		}
	}
	slices.Sort(slots)
	return slots, nil
}
