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
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/retry"
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

// writeBundle makes the bundle of container i of containers in sandbox id
// at dir: its root filesystem overlay and its spec.
func writeBundle(dir string, w runtime.Workload, containers []runtime.Checked, i int, id, netnsPath string) error {
	rootfs, err := prepareBundle(dir, containers[i])
	if err != nil {
		return err
	}
	spec, err := specJSON(buildSpec(w, containers[i], rootfs, netnsPath, annotations(containers, i, id)))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), spec, 0o644)
}

// The annotations runsc (like containerd's shim) reads to put several
// containers in one sandbox.
const (
	annotationType    = "io.kubernetes.cri.container-type"
	annotationSandbox = "io.kubernetes.cri.sandbox-id"
	// The name matches each container with its state in a checkpoint
	// image; container ids change with every start.
	annotationName = "io.kubernetes.cri.container-name"
)

// annotations place container i of containers in sandbox id. A sandbox of
// one container has none, so its spec stays the one its existing images
// were taken with.
func annotations(containers []runtime.Checked, i int, id string) map[string]string {
	if len(containers) == 1 {
		return nil
	}
	kind := "container"
	if i == 0 {
		kind = "sandbox"
	}
	return map[string]string{annotationType: kind, annotationSandbox: id, annotationName: containers[i].Container.GetName()}
}

// subBundleDir is the bundle of container name, not the first, in the
// sandbox whose bundle is dir.
func subBundleDir(dir, name string) string { return filepath.Join(dir, "containers", name) }

// subID is the runsc id of container name, not the first, in sandbox id:
// <slot>_+<name>+<generation>. runsc takes any unique prefix of an id for
// the id, so no id may be a prefix of another: a sandbox id has no subSep
// where this has its first, and subSep ends every name.
func subID(id, name string) string {
	slot, gen, _ := strings.Cut(id, idSep)
	return slot + idSep + subSep + name + subSep + gen
}

// nameFile holds, in each bundle, the name of its container.
const nameFile = "name"

// prepareBundle makes a bundle directory with its root filesystem
// overlay mounted, returning the overlay's path.
func prepareBundle(dir string, c runtime.Checked) (string, error) {
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{rootfs, filepath.Join(dir, "upper"), filepath.Join(dir, "work")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, nameFile), []byte(c.Container.GetName()), 0o644); err != nil {
		return "", err
	}
	// runsc's gofer creates missing mount points in the root filesystem
	// on the host; a private kernel overlay keeps them out of the shared
	// rootfs.
	if strings.ContainsAny(c.Rootfs, ",:\\") {
		return "", fmt.Errorf("rootfs path %q contains one of ',', ':', '\\', which overlayfs options cannot carry", c.Rootfs)
	}
	// volatile: unmounting would otherwise sync the whole host filesystem
	// holding upper, with the image just written (tens of ms); upper only
	// ever holds empty mount point directories.
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,volatile", c.Rootfs, filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
		return "", fmt.Errorf("mount rootfs overlay at %s: %w", rootfs, err)
	}
	return rootfs, nil
}

func specJSON(spec ociSpec) ([]byte, error) { return json.MarshalIndent(spec, "", " ") }

// warmFile marks a warm sandbox's bundle; it records what the spec does
// not: the root filesystem under the overlay.
const warmFile = "warm.json"

type warmRecord struct {
	Rootfs string `json:"rootfs"`
}

// mountPoint is where a warm sandbox of bundle dir takes its i-th bind
// mount from.
func mountPoint(dir string, i int) string { return filepath.Join(dir, "mnt", strconv.Itoa(i)) }

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

func readJSONFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
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

// stateMagic begins runsc's state file (checkpoint.img): it is followed
// by an 8-byte big-endian metadata length, the metadata, and the
// sandbox's kernel state.
const stateMagic = "gVisorSF"

// CheckImage reports whether imageDir holds a complete memory image as
// far as can be told without restoring it. A sandbox finishes a capture
// it began even when the runsc command that asked for it dies, but one
// that itself dies while saving leaves checkpoint.img with its header
// and metadata only: the kernel state is written last, after memory.
func (r *Runtime) CheckImage(imageDir string) error {
	_, err := imageMetadata(imageDir)
	return err
}

// imageMetadata reads the metadata of the complete memory image in
// imageDir (see CheckImage).
func imageMetadata(imageDir string) (map[string]string, error) {
	path := filepath.Join(imageDir, "checkpoint.img")
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("memory image %s: %w (%w)", imageDir, runtime.ErrNoImage, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("memory image %s: %w", imageDir, err)
	}
	header := make([]byte, len(stateMagic)+8)
	if _, err := io.ReadFull(f, header); err != nil || string(header[:len(stateMagic)]) != stateMagic {
		return nil, fmt.Errorf("memory image %s: %s has no state file header: %w", imageDir, path, runtime.ErrNoImage)
	}
	n := binary.BigEndian.Uint64(header[len(stateMagic):])
	if end := int64(len(header)) + int64(n); fi.Size() <= end || end < 0 {
		return nil, fmt.Errorf("memory image %s: %s ends after its metadata (%d bytes): the capture was cut short: %w", imageDir, path, fi.Size(), runtime.ErrNoImage)
	}
	raw := make([]byte, n)
	metadata := map[string]string{}
	if _, err := io.ReadFull(f, raw); err != nil {
		return nil, fmt.Errorf("memory image %s: metadata: %w", imageDir, err)
	}
	if err := json.Unmarshal(raw, &metadata); err != nil {
		return nil, fmt.Errorf("memory image %s: metadata: %w", imageDir, err)
	}
	return metadata, nil
}

// checkImageContainers makes sure the image in imageDir holds exactly the
// containers of w. runsc restores the image's containers as they join the
// sandbox and completes the restore with the last one: a workload with a
// container fewer would leave it waiting for good, one with another
// container would fail only after its sandbox was made.
func checkImageContainers(imageDir string, containers []runtime.Checked) error {
	metadata, err := imageMetadata(imageDir)
	if err != nil {
		return err
	}
	var specs map[string]json.RawMessage
	if err := json.Unmarshal([]byte(metadata["container_specs"]), &specs); err != nil {
		return fmt.Errorf("memory image %s: container specs: %w", imageDir, err)
	}
	have := slices.Sorted(maps.Keys(specs))
	want := make([]string, 0, len(containers))
	for i := range containers {
		if name := annotations(containers, i, "")[annotationName]; name != "" {
			want = append(want, name)
		} else {
			// runsc's own name for an unnamed container, by creation order.
			want = append(want, "__no_name_"+strconv.Itoa(i))
		}
	}
	slices.Sort(want)
	if !slices.Equal(have, want) {
		return fmt.Errorf("memory image %s holds containers %q, the workload has %q: it was taken from another workload", imageDir, have, want)
	}
	return nil
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

// socket is the control socket runsc makes for sandbox id.
func (r *Runtime) socket(id string) string {
	return filepath.Join(r.runscDir, "runsc-"+id+".sock")
}

// stateFile is where runsc records container id of sandbox sandboxID.
func (r *Runtime) stateFile(id, sandboxID string) string {
	return filepath.Join(r.runscDir, id+"_sandbox:"+sandboxID+".state")
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

// delete deletes runsc's container id, running or not.
func (r *Runtime) delete(ctx context.Context, id string) error {
	if _, err := r.output(ctx, "delete", "--force", id); err != nil {
		// delete succeeds on unknown ids; failing, it may still have
		// removed the container (one whose sandbox is gone fails to stop
		// it, yet goes).
		known, listErr := r.containers(ctx)
		if listErr != nil || slices.Contains(known, id) {
			return err
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

// state is the part of `runsc state` output used here.
type state struct {
	Status string `json:"status"`
	// The sandbox process (the sentry).
	Pid int `json:"pid"`
}

func (r *Runtime) state(ctx context.Context, id string) (state, error) {
	var st state
	out, err := r.output(ctx, "state", id)
	if err != nil {
		return st, fmt.Errorf("state of sandbox %s: %w", id, err)
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("state of sandbox %s: %w", id, err)
	}
	return st, nil
}

// events is the part of `runsc events --stats` output used here.
type events struct {
	Data struct {
		Memory struct {
			Usage struct {
				Usage int64 `json:"usage"`
			} `json:"usage"`
		} `json:"memory"`
	} `json:"data"`
}

// Stats implements runtime.Runtime. Memory and CPU are best effort (0 if
// runsc cannot tell).
func (r *Runtime) Stats(ctx context.Context, slot runtime.Slot) (runtime.Stats, error) {
	if err := checkSlotName(slot.Name); err != nil {
		return runtime.Stats{}, fmt.Errorf("stats: %w", err)
	}
	defer r.lock(slot.Name)()
	ids, warm, err := r.sandboxes(slot.Name)
	if err != nil {
		return runtime.Stats{}, err
	}
	if len(ids) == 0 {
		if len(warm) == 0 {
			return runtime.Stats{}, nil
		}
		// A warm sandbox runsc no longer holds as created (it died, or
		// began running and the runtime stopped before recording it) is
		// no warm sandbox: it is reported as one that is not running,
		// which a node removes.
		if st, err := r.state(ctx, warm[0]); err != nil || st.Status != "created" {
			return runtime.Stats{Running: err == nil && st.Status == "running"}, nil
		}
		return runtime.Stats{Warm: true}, nil
	}
	id := ids[0]
	st, err := r.state(ctx, id)
	if err != nil {
		// runsc no longer holds the sandbox whole (it exited after saving
		// itself, or its runsc command died with its agent half way):
		// it runs no workload, and a node removes it. An agent that
		// refused to start over it would lose every workload it hosts.
		r.log.Warn("sandbox state unreadable; taking it for stopped", "slot", slot.Name, "sandbox", id, "err", err)
		return runtime.Stats{}, nil
	}
	stats := runtime.Stats{Running: st.Status == "running"}
	// runsc state has no start time; the spec is written right before
	// runsc starts the sandbox.
	if fi, err := os.Stat(filepath.Join(r.bundleDir(slot.Name, id), "config.json")); err == nil {
		stats.Started = fi.ModTime()
	}
	if !stats.Running {
		return stats, nil
	}
	// Memory from the sentry's accounting; its CPU figure is the
	// cgroup's, the host's without one (cpu.go).
	if out, err := r.output(ctx, "events", "--stats", id); err == nil {
		var ev events
		if json.Unmarshal(out, &ev) == nil {
			stats.MemoryBytes = ev.Data.Memory.Usage.Usage
		}
	}
	if st.Pid > 0 {
		if cpu, err := treeCPU("/proc", st.Pid); err == nil {
			stats.CPU = cpu
		}
	}
	return stats, nil
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

func (r *Runtime) lock(slot string) (unlock func()) {
	r.mu.Lock()
	m, ok := r.slots[slot]
	if !ok {
		m = &sync.Mutex{}
		r.slots[slot] = m
	}
	r.mu.Unlock()
	m.Lock()
	return m.Unlock
}

func (r *Runtime) bundleDir(slot, id string) string { return filepath.Join(r.slotsDir, slot, id) }

// bundles lists the sandboxes of slot that have a bundle directory.
func (r *Runtime) bundles(slot string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(r.slotsDir, slot))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("slot %s: %w", slot, err)
	}
	ids := make([]string, 0, len(entries))
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids, nil
}

// sandboxes splits the sandboxes of slot into active ones (running, or
// stopped and not removed yet) and warm ones.
func (r *Runtime) sandboxes(slot string) (active, warm []string, err error) {
	ids, err := r.bundles(slot)
	if err != nil {
		return nil, nil, err
	}
	for _, id := range ids {
		if _, err := os.Stat(filepath.Join(r.bundleDir(slot, id), warmFile)); err == nil {
			warm = append(warm, id)
		} else {
			active = append(active, id)
		}
	}
	return active, warm, nil
}

// containers lists the container ids runsc knows.
func (r *Runtime) containers(ctx context.Context) ([]string, error) {
	out, err := r.output(ctx, "list", "--quiet")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// idSep separates the slot from the generation in a sandbox id; slot names
// cannot contain it. subSep frames the name of a container that joined a
// sandbox in its id (see subID); generations and names cannot contain it.
const (
	idSep  = "_"
	subSep = "+"
)

// newID names a new sandbox of slot: unique per start, so a restore never
// collides with what runsc remembers of an earlier sandbox.
func (r *Runtime) newID(slot string) (string, error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	id := slot + idSep + hex.EncodeToString(b)
	// runsc puts a control socket named after the id under its root; a
	// unix socket path holds at most 107 bytes.
	if sock := r.socket(id); len(sock) > 107 {
		return "", fmt.Errorf("slot %s: runsc socket path %s is longer than 107 bytes: use a shorter root dir or slot name", slot, sock)
	}
	return id, nil
}

func slotOf(id string) string {
	slot, _, ok := strings.Cut(id, idSep)
	if !ok {
		return ""
	}
	return slot
}

func checkSlotName(name string) error {
	if name == "" {
		return errors.New("slot has no name")
	}
	if name == "." || name == ".." {
		return fmt.Errorf("slot name %q is not a file name", name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return fmt.Errorf("slot name %q: only letters, digits, '-' and '.' are allowed", name)
		}
	}
	return nil
}

func checkSlot(slot runtime.Slot) error {
	if err := checkSlotName(slot.Name); err != nil {
		return err
	}
	if slot.NetNS == "" || !filepath.IsAbs(slot.NetNS) {
		return fmt.Errorf("slot %s: network namespace path %q is not absolute", slot.Name, slot.NetNS)
	}
	return nil
}

// output runs a runsc command that exits when done, returning its stdout;
// its stderr goes into the error.
func (r *Runtime) output(ctx context.Context, args ...string) ([]byte, error) {
	cmd := r.command(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A sandbox forked by mistake would hold the pipes open forever.
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("runsc %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// detached runs a runsc command that leaves a sandbox behind. The sandbox
// inherits runsc's stdout and stderr for the workload's, so they go to a
// file (a pipe would never close); runsc's own errors land there too.
func (r *Runtime) detached(ctx context.Context, logPath string, args ...string) error {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	start, _ := f.Seek(0, io.SeekEnd)
	cmd := r.command(ctx, args...)
	cmd.Stdout, cmd.Stderr = f, f
	err = cmd.Run()
	f.Close()
	if err != nil {
		return fmt.Errorf("runsc %s: %w: %s", subcommand(args), err, tail(logPath, start, 2048))
	}
	return nil
}

// tail returns up to limit bytes written to path after offset from.
func tail(path string, from, limit int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return ""
	}
	from = max(from, end-limit)
	b := make([]byte, end-from)
	n, _ := f.ReadAt(b, from)
	return strings.TrimSpace(string(b[:n]))
}

// command runs runsc with the runtime's flags. A runsc command dies with
// the agent that started it: one finishing after the agent was killed (and
// a restarted agent cleaned its slot) would leave a stray sandbox. The
// signal does not reach the sandbox processes runsc forks, so a running
// workload outlives the agent, as adoption after a restart needs.
func (r *Runtime) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.runsc, append(slices.Clone(r.flags), args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}
