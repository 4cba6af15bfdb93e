// Package gvisor runs workloads in gVisor sandboxes through the runsc
// command: one sandbox per worker slot, in the slot's network namespace,
// with the workload's root filesystem shared read-only between slots and
// every write kept in runsc's in-memory overlay (and so in checkpoints).
//
// Layout under Config.RootDir:
//
//	runsc/                          runsc --root: its container state
//	sethostname                     the program that sets a hostname (hostname.go)
//	slots/<slot>/<sandbox>/         one sandbox's bundle: its first container's
//	    config.json                 OCI spec
//	    name                        the container's name
//	    rootfs/                     overlay of the shared rootfs (see below)
//	    upper/ work/                that overlay's private layers
//	    console.log                 runsc errors, and the workload's stdout
//	                                and stderr when the slot has no Output
//	    warm.json                   only while the sandbox is warm (below)
//	    hostname                    the hostname the guest keeps (hostname.go)
//	    mnt/<i>/                    warm sandboxes: where the i-th bind
//	                                mount's host directory is mounted
//	    containers/<name>/          the bundle of each further container
//	        config.json name rootfs/ upper/ work/
//
// A sandbox's directory exists from before runsc is invoked until after
// runsc deleted it, so the directories alone tell whether a slot is busy.
//
// Several containers. A template's containers share one sandbox, as a
// pod's do under containerd's runsc shim: the first container's runsc id
// is the sandbox's, and the others join it (see subID), each with
// its own root filesystem, process and mounts, all in one network stack.
// Their specs carry the CRI annotations runsc reads for that, the name
// included, by which a restore matches each container with its state in
// the image (ids change with every start). A checkpoint of the sandbox
// holds every container; a restore restores the first container, which
// waits in the sandbox until the others are restored into it too. A
// sandbox of one container has no annotations, so its images from before
// keep restoring.
//
// Warm sandboxes. Warm runs `runsc create` for a workload's first
// container ahead of time: sandbox and gofer boot, nothing runs (the
// other containers join when it starts). Its spec names mnt/<i> as the
// source of every bind mount, each a shared mount of itself, so the gofer's
// copies receive what is mounted on them later. Run or Restore of a
// matching workload mounts the workload's host directories there and runs
// `runsc start` or `runsc restore` into the sandbox, skipping its boot;
// warm.json is removed once it runs. The host directories therefore need
// not exist when the slot is warmed (volumes are per actor and made just
// before a start), and a warm sandbox never holds a workload's data.
package gvisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/runtime"
)

// Class is the sandbox class this runtime serves.
const Class = "gvisor"

// Config configures the runtime.
type Config struct {
	// Runsc is the path of a statically linked runsc binary.
	Runsc string
	// RootDir holds runsc's state and the sandboxes' bundles. One runtime
	// per RootDir.
	RootDir string
	// Platform is runsc's platform; default systrap.
	Platform string
	// ConfigureNetwork gives a slot's guest interface its address, route
	// and loopback in the slot's network namespace (netns.Configure does,
	// for the node's network). runsc takes the address off the interface
	// when a sandbox starts, so the runtime calls it before every start and
	// after a sandbox leaves, only while none runs in the slot. Required.
	ConfigureNetwork func(ctx context.Context, slot runtime.Slot) error
	Logger           *slog.Logger
}

// Runtime implements runtime.Runtime with runsc.
type Runtime struct {
	runsc    string
	flags    []string
	runscDir string
	slotsDir string
	log      *slog.Logger

	// configureNetwork is Config.ConfigureNetwork.
	configureNetwork func(ctx context.Context, slot runtime.Slot) error

	mu    sync.Mutex
	slots map[string]*sync.Mutex
}

var _ runtime.Runtime = (*Runtime)(nil)

// commandTimeout bounds runsc commands that must not hang a caller whose
// context has no deadline (cleanup after a failure or a cancellation).
const commandTimeout = 30 * time.Second

// New checks cfg and creates the root directory.
func New(cfg Config) (*Runtime, error) {
	if cfg.Runsc == "" {
		return nil, errors.New("gvisor config: runsc: no path given")
	}
	fi, err := os.Stat(cfg.Runsc)
	if err != nil {
		return nil, fmt.Errorf("gvisor config: runsc: %w", err)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("gvisor config: runsc: %s is not an executable file", cfg.Runsc)
	}
	if cfg.RootDir == "" {
		return nil, errors.New("gvisor config: root dir: no path given")
	}
	root, err := filepath.Abs(cfg.RootDir)
	if err != nil {
		return nil, fmt.Errorf("gvisor config: root dir: %w", err)
	}
	if cfg.ConfigureNetwork == nil {
		return nil, errors.New("gvisor config: no ConfigureNetwork to give slots their addresses")
	}
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Runtime{
		runsc:    cfg.Runsc,
		runscDir: filepath.Join(root, "runsc"),
		slotsDir: filepath.Join(root, "slots"),
		log:      cfg.Logger.With("runtime", Class),
		slots:    map[string]*sync.Mutex{},

		configureNetwork: cfg.ConfigureNetwork,
	}
	r.flags = []string{
		"--root=" + r.runscDir,
		"--platform=" + cfg.Platform,
		"--network=sandbox",
		// The rootfs is shared: writes go to sandbox memory, which the
		// checkpoint captures. (The default, root:self, would put a
		// filestore file into the shared rootfs.)
		"--overlay2=root:memory",
		// Nothing sets limits yet, and a cgroup per sandbox costs 20-70 ms
		// per start on this cgroup v1 host (and is one more thing to
		// clean up). Enforcing template resources will need them back.
		"--ignore-cgroups",
	}
	for _, d := range []string{r.runscDir, r.slotsDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("gvisor config: root dir: %w", err)
		}
	}
	if err := r.writeHostnameProgram(); err != nil {
		return nil, fmt.Errorf("gvisor config: root dir: %w", err)
	}
	return r, nil
}

// Class implements runtime.Runtime.
func (r *Runtime) Class() string { return Class }

// Run implements runtime.Runtime.
func (r *Runtime) Run(ctx context.Context, slot runtime.Slot, w runtime.Workload) error {
	return r.start(ctx, slot, w, "")
}

// Restore implements runtime.Runtime. The image must come from a sandbox of
// the same template (runsc checks the spec); slot and volume paths may
// differ.
func (r *Runtime) Restore(ctx context.Context, slot runtime.Slot, w runtime.Workload, imageDir string) error {
	if imageDir == "" {
		return fmt.Errorf("slot %s: restore actor %s: image dir: %w", slot.Name, w.ActorUID, runtime.ErrNoImage)
	}
	if _, err := os.Stat(filepath.Join(imageDir, "checkpoint.img")); err != nil {
		return fmt.Errorf("slot %s: restore actor %s from %s: %w (%v)", slot.Name, w.ActorUID, imageDir, runtime.ErrNoImage, err)
	}
	return r.start(ctx, slot, w, imageDir)
}

// start cold-boots w (imageDir empty) or restores it from imageDir, into
// the slot's warm sandbox when it matches w.
func (r *Runtime) start(ctx context.Context, slot runtime.Slot, w runtime.Workload, imageDir string) error {
	verb := "run"
	if imageDir != "" {
		verb = "restore"
	}
	if err := checkSlot(slot); err != nil {
		return fmt.Errorf("%s actor %s: %w", verb, w.ActorUID, err)
	}
	containers, err := w.Check()
	if err != nil {
		return fmt.Errorf("slot %s: %s: %w", slot.Name, verb, err)
	}
	if imageDir != "" {
		if imageDir, err = filepath.Abs(imageDir); err != nil {
			return fmt.Errorf("slot %s: %s actor %s: image dir: %w", slot.Name, verb, w.ActorUID, err)
		}
		if err := checkImageContainers(imageDir, containers); err != nil {
			return fmt.Errorf("slot %s: %s actor %s: %w", slot.Name, verb, w.ActorUID, err)
		}
	}
	defer r.lock(slot.Name)()
	active, warm, err := r.sandboxes(slot.Name)
	if err != nil {
		return err
	}
	if len(active) > 0 {
		return fmt.Errorf("slot %s: %s actor %s: %w (sandbox %s)", slot.Name, verb, w.ActorUID, runtime.ErrBusy, active[0])
	}
	// The previous sandbox took the address with it (see
	// Config.ConfigureNetwork).
	if err := r.configureNetwork(ctx, slot); err != nil {
		return fmt.Errorf("%s actor %s: %w", verb, w.ActorUID, err)
	}
	log := r.log.With("slot", slot.Name, "actor_uid", w.ActorUID)
	if len(warm) == 1 && r.matches(slot, warm[0], w, containers, imageDir != "") {
		began := time.Now()
		err := r.activate(ctx, slot, w, warm[0], containers, imageDir)
		if err == nil {
			log.Debug("sandbox started in the warm sandbox", "sandbox", warm[0], "verb", verb, "image", imageDir, "took", time.Since(began))
			return nil
		}
		// Whatever went wrong, the slot's usual path decides.
		log.Warn("starting in the warm sandbox failed; starting a new one", "sandbox", warm[0], "verb", verb, "err", err)
		if err := r.removeCleanly(ctx, slot.Name, warm[0]); err != nil {
			return fmt.Errorf("slot %s: %s actor %s: remove the warm sandbox that failed: %w", slot.Name, verb, w.ActorUID, err)
		}
		warm = nil
		if err := r.configureNetwork(ctx, slot); err != nil {
			return fmt.Errorf("%s actor %s: %w", verb, w.ActorUID, err)
		}
	}
	// A warm sandbox made for another workload goes, meanwhile: it has
	// not touched the network, and the new sandbox does not wait for it.
	discarded := r.discard(ctx, slot.Name, warm)
	id, err := r.newID(slot.Name)
	if err != nil {
		return errors.Join(err, discarded())
	}
	log = log.With("sandbox", id)
	began := time.Now()
	err = r.launch(ctx, slot, w, containers, id, imageDir)
	if err != nil {
		// Leave the slot empty, so the caller can simply try again.
		cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commandTimeout)
		defer cancel()
		if rmErr := r.remove(cleanupCtx, slot.Name, id); rmErr != nil {
			log.Error("removing a sandbox that failed to start", "err", rmErr)
		}
		return errors.Join(fmt.Errorf("slot %s: %s actor %s (%s/%s) as sandbox %s: %w", slot.Name, verb, w.ActorUID, w.Space, w.Actor, id, err), discarded())
	}
	if err := discarded(); err != nil {
		return fmt.Errorf("slot %s: %s actor %s: %w", slot.Name, verb, w.ActorUID, err)
	}
	log.Debug("sandbox started", "verb", verb, "image", imageDir, "took", time.Since(began))
	return nil
}

// launch starts a new sandbox id for containers: the first one makes
// the sandbox, the others join it.
func (r *Runtime) launch(ctx context.Context, slot runtime.Slot, w runtime.Workload, containers []runtime.Checked, id, imageDir string) error {
	dir := r.bundleDir(slot.Name, id)
	if err := writeBundle(dir, w, containers, 0, id, slot.NetNS); err != nil {
		return err
	}
	if err := r.detachedFor(ctx, slot, 0, dir, startArgs(dir, id, imageDir)...); err != nil {
		return err
	}
	if err := r.join(ctx, slot, w, containers, id, imageDir); err != nil {
		return err
	}
	return r.nameRestored(ctx, slot.Name, id, w.Actor, hostnameOf(w.Actor), imageDir)
}

// startArgs is the runsc command that creates and starts container id of
// the bundle at dir, or restores it from imageDir.
func startArgs(dir, id, imageDir string) []string {
	if imageDir == "" {
		return []string{"run", "--detach", "--bundle=" + dir, id}
	}
	return []string{"restore", "--detach", "--image-path=" + imageDir, "--bundle=" + dir, id}
}

// join starts (or restores) the containers after the first in the
// running sandbox id. A restore of the first container waits in the
// sandbox until every container the image holds is restored as well: the
// last one completes it.
func (r *Runtime) join(ctx context.Context, slot runtime.Slot, w runtime.Workload, containers []runtime.Checked, id, imageDir string) error {
	dir := r.bundleDir(slot.Name, id)
	for i := 1; i < len(containers); i++ {
		name := containers[i].Container.GetName()
		sub := subBundleDir(dir, name)
		if err := writeBundle(sub, w, containers, i, id, slot.NetNS); err != nil {
			return fmt.Errorf("container %s: %w", name, err)
		}
		if err := r.detachedFor(ctx, slot, i, dir, startArgs(sub, subID(id, name), imageDir)...); err != nil {
			return fmt.Errorf("container %s: %w", name, err)
		}
	}
	return nil
}

// Checkpoint implements runtime.Runtime. The image is uncompressed: flate
// costs more time on both ends than the smaller image saves here.
func (r *Runtime) Checkpoint(ctx context.Context, slot runtime.Slot, imageDir string, leaveRunning bool) error {
	if err := checkSlotName(slot.Name); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if imageDir == "" {
		return fmt.Errorf("slot %s: checkpoint: no image dir given", slot.Name)
	}
	abs, err := filepath.Abs(imageDir)
	if err != nil {
		return fmt.Errorf("slot %s: checkpoint: image dir: %w", slot.Name, err)
	}
	defer r.lock(slot.Name)()
	ids, _, err := r.sandboxes(slot.Name)
	if err != nil {
		return err
	}
	if len(ids) != 1 {
		return fmt.Errorf("slot %s: checkpoint: %w (%d sandboxes)", slot.Name, runtime.ErrNotRunning, len(ids))
	}
	id := ids[0]
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return fmt.Errorf("slot %s: checkpoint: image dir: %w", slot.Name, err)
	}
	// Before the capture: an image is complete only with it.
	if err := keepPinned(r.bundleDir(slot.Name, id), abs); err != nil {
		return fmt.Errorf("slot %s: checkpoint: %w", slot.Name, err)
	}
	args := []string{"checkpoint", "--compression=none", "--image-path=" + abs}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	began := time.Now()
	if _, err := r.output(ctx, append(args, id)...); err != nil {
		if st, stErr := r.state(ctx, id); stErr == nil && st.Status != "running" {
			err = fmt.Errorf("%w (%s): %w", runtime.ErrNotRunning, st.Status, err)
		}
		return fmt.Errorf("slot %s: checkpoint sandbox %s into %s: %w", slot.Name, id, abs, err)
	}
	r.log.Debug("sandbox checkpointed", "slot", slot.Name, "sandbox", id, "image", abs, "leave_running", leaveRunning, "took", time.Since(began))
	if leaveRunning {
		return nil
	}
	// The sandbox stopped; its remains would keep the slot busy.
	if err := r.remove(ctx, slot.Name, id); err != nil {
		return fmt.Errorf("slot %s: checkpoint: %w", slot.Name, err)
	}
	return r.vacate(ctx, slot)
}

// Close releases runsc's state shared by all sandboxes (a namespace mount
// under its root) if no sandbox is left. Running sandboxes are left alone:
// a restarted node adopts them. Call it at shutdown, after the last Run or
// Restore: a sandbox starting meanwhile could miss that namespace.
func (r *Runtime) Close(ctx context.Context) error {
	slots, err := r.Sandboxes(ctx)
	if err != nil {
		return err
	}
	if len(slots) > 0 {
		return nil
	}
	// runsc bind-mounts an empty network namespace for its gofers there.
	nullNS := filepath.Join(r.runscDir, "null-netns")
	for unix.Unmount(nullNS, unix.MNT_DETACH) == nil {
	}
	if err := os.Remove(nullNS); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("gvisor: close: %w", err)
	}
	// New writes it again.
	if err := os.Remove(r.hostnameProgramPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("gvisor: close: %w", err)
	}
	return nil
}
