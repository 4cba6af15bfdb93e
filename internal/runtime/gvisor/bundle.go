package gvisor

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/torpor-dev/torpor/internal/runtime"
	"golang.org/x/sys/unix"
)

// Bundles: the on-disk layout of a slot's sandboxes (see the package
// comment), their OCI specs and the CRI annotations that put several
// containers in one sandbox, and the ids of sandboxes and containers.

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

// mountPoint is where a warm sandbox of bundle dir takes its i-th bind
// mount from.
func mountPoint(dir string, i int) string { return filepath.Join(dir, "mnt", strconv.Itoa(i)) }

func readJSONFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
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
