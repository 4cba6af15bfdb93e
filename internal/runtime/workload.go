package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/validate"
)

// Errors every runtime wraps, so a node can tell a wrong request from a
// failing sandbox.
var (
	// ErrBusy: the slot already has a sandbox; terminate it first.
	ErrBusy = errdefs.New(errdefs.ErrFailedPrecondition, "slot already has a sandbox")
	// ErrNotRunning: the slot has no running sandbox.
	ErrNotRunning = errdefs.New(errdefs.ErrFailedPrecondition, "slot has no running sandbox")
	// ErrNoImage: the image directory holds no checkpoint image.
	ErrNoImage = errdefs.New(errdefs.ErrFailedPrecondition, "no checkpoint image")
)

// BindMount is a host directory made visible at a guest path.
type BindMount struct {
	Host, Guest string
	ReadOnly    bool
}

// Checked is one container of a workload reduced to what a sandbox needs
// to run it, with every reference resolved and every host path verified
// to exist.
type Checked struct {
	Container *torporv1.Container
	Rootfs    string
	// Process: the container's settings over its image's configuration.
	Process Process
	// Mounts: the container's volume mounts, then the extra mounts sorted
	// by guest path, so the same workload always yields the same order (a
	// restore is validated against the checkpointed mount list).
	Mounts []BindMount
}

// Check validates w, returning its containers in template order: one
// sandbox runs them all, the first one starting it. Runtimes call it
// before doing anything, so bad input fails the same way on every
// runtime, naming the field at fault.
func (w Workload) Check() ([]Checked, error) { return w.check(true) }

// CheckShape is Check for a workload that is not started yet (see
// Runtime.Warm): the host directories of its mounts are checked for being
// absolute paths, but need not exist yet. The root filesystems must.
func (w Workload) CheckShape() ([]Checked, error) { return w.check(false) }

func (w Workload) check(hostsExist bool) ([]Checked, error) {
	tmpl := w.Template
	if tmpl == nil {
		return nil, fmt.Errorf("actor %s: workload has no template", w.ActorUID)
	}
	if len(tmpl.GetContainers()) == 0 {
		return nil, fmt.Errorf("actor %s: template has 0 containers", w.ActorUID)
	}
	declared := map[string]bool{}
	for _, v := range tmpl.GetVolumes() {
		declared[v.GetName()] = true
	}
	out := make([]Checked, 0, len(tmpl.GetContainers()))
	names := map[string]bool{}
	for i, c := range tmpl.GetContainers() {
		// The name also names the container's files and runtime ids.
		if err := validate.Name(fmt.Sprintf("containers[%d].name", i), c.GetName()); err != nil {
			return nil, fmt.Errorf("actor %s: %w", w.ActorUID, err)
		}
		if names[c.GetName()] {
			return nil, fmt.Errorf("actor %s: containers[%d].name: %q is used by another container", w.ActorUID, i, c.GetName())
		}
		names[c.GetName()] = true
		checked, err := w.checkContainer(c, declared, hostsExist)
		if err != nil {
			return nil, err
		}
		if i == 0 && len(w.Init) > 0 {
			checked.Process.Args = append(slices.Clone(w.Init), checked.Process.Args...)
		}
		out = append(out, checked)
	}
	return out, nil
}

func (w Workload) checkContainer(c *torporv1.Container, declared map[string]bool, hostsExist bool) (Checked, error) {
	field := fmt.Sprintf("containers[%q]", c.GetName())
	if wd := c.GetWorkingDir(); wd != "" && !filepath.IsAbs(wd) {
		return Checked{}, fmt.Errorf("actor %s: %s.working_dir %q is not absolute", w.ActorUID, field, wd)
	}
	rootfs := w.Rootfs[c.GetName()]
	if err := hostDir(rootfs); err != nil {
		return Checked{}, fmt.Errorf("actor %s: rootfs of %s: %w", w.ActorUID, field, err)
	}
	proc, err := containerProcess(c, w.ImageConfig[c.GetName()], rootfs)
	if err != nil {
		return Checked{}, fmt.Errorf("actor %s: %s: %w", w.ActorUID, field, err)
	}
	out := Checked{Container: c, Rootfs: rootfs, Process: proc}
	guests := map[string]string{}
	addMount := func(what string, m BindMount) error {
		if !filepath.IsAbs(m.Guest) {
			return fmt.Errorf("actor %s: %s: guest path %q is not absolute", w.ActorUID, what, m.Guest)
		}
		m.Guest = filepath.Clean(m.Guest)
		if prev, ok := guests[m.Guest]; ok {
			return fmt.Errorf("actor %s: %s: guest path %s is already used by %s", w.ActorUID, what, m.Guest, prev)
		}
		check := hostDir
		if !hostsExist {
			check = absPath
		}
		if err := check(m.Host); err != nil {
			return fmt.Errorf("actor %s: %s: %w", w.ActorUID, what, err)
		}
		guests[m.Guest] = what
		out.Mounts = append(out.Mounts, m)
		return nil
	}
	for i, m := range c.GetMounts() {
		what := fmt.Sprintf("%s.mounts[%d] (volume %q)", field, i, m.GetVolume())
		if !declared[m.GetVolume()] {
			return Checked{}, fmt.Errorf("actor %s: %s: the template declares no such volume", w.ActorUID, what)
		}
		host, ok := w.Volumes[m.GetVolume()]
		if !ok {
			return Checked{}, fmt.Errorf("actor %s: %s: the workload has no host directory for it", w.ActorUID, what)
		}
		if err := addMount(what, BindMount{Host: host, Guest: m.GetPath(), ReadOnly: m.GetReadOnly()}); err != nil {
			return Checked{}, err
		}
	}
	// Extra mounts (the workload identity) reach every container.
	extra := make([]string, 0, len(w.ExtraMounts))
	for guest := range w.ExtraMounts {
		extra = append(extra, guest)
	}
	slices.Sort(extra)
	for _, guest := range extra {
		what := fmt.Sprintf("extra mount %s of %s", guest, field)
		if err := addMount(what, BindMount{Host: w.ExtraMounts[guest], Guest: guest, ReadOnly: true}); err != nil {
			return Checked{}, err
		}
	}
	return out, nil
}

func absPath(path string) error {
	if path == "" {
		return errors.New("no host directory given")
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("host directory %q is not absolute", path)
	}
	return nil
}

func hostDir(path string) error {
	if err := absPath(path); err != nil {
		return err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", path)
	}
	return nil
}
