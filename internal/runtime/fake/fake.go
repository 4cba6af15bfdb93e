// Package fake is an in-process runtime.Runtime for unit tests: no
// sandboxes, but the same rules as the real runtime (shared workload
// checks, busy slots, images that must exist and match the workload), real
// image files, a workload "memory" that only a checkpoint carries to a
// restore, and faults on request.
package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/internal/runtime"
)

// Class is the sandbox class the fake claims; templates of class "gvisor"
// (the default) run on it unchanged.
const Class = "gvisor"

// imageFile is the fake's memory image inside an image directory.
const imageFile = "fake-image.json"

// TouchLog is the file Touch appends to in every writable volume.
const TouchLog = "touch.log"

// Call is one method call, recorded before faults apply.
type Call struct {
	Method       string
	Slot         string
	ActorUID     string
	ImageDir     string
	LeaveRunning bool
	// Warm: this Run or Restore started in the slot's warm sandbox.
	Warm bool
	// Exec: the container and the command.
	Container string
	Cmd       []string
}

// Runtime is the fake. The zero value is not usable; call New.
type Runtime struct {
	mu        sync.Mutex
	sandboxes map[string]*sandbox // by slot name
	warm      map[string]warmed   // by slot name: what it was warmed for
	calls     []Call
	faults    map[string][]fault // by method, oldest first
	gen       int
}

// warmed is what a warm slot was made for: an actor's name (its
// hostname) and the shape of its workload.
type warmed struct{ actor, shape string }

// serves says whether a start of w (shape of) in a slot warm for wm
// uses the warm sandbox: a restore of any actor of the shape does, as
// gVisor's renames the restored guest; a cold boot only of the actor.
func (wm warmed) serves(w runtime.Workload, shape string, restore bool) bool {
	return wm.shape == shape && (restore || wm.actor == w.Actor)
}

type sandbox struct {
	id      string
	w       runtime.Workload
	spec    spec
	memory  int64
	started time.Time
	crashed bool
	// startedWarm: it started in a warm sandbox.
	startedWarm bool
}

// spec is what a restore must match, as runsc checks the OCI spec of
// each container by name.
type spec map[string]containerSpec

type containerSpec struct {
	Args   []string `json:"args"`
	Mounts []string `json:"mounts"`
}

type image struct {
	Spec   spec  `json:"spec"`
	Memory int64 `json:"memory"`
}

type fault struct {
	err     error
	release chan struct{} // non-nil: block until closed
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns an empty fake runtime.
func New() *Runtime {
	return &Runtime{sandboxes: map[string]*sandbox{}, warm: map[string]warmed{}, faults: map[string][]fault{}}
}

// FailNext makes the next call of method (e.g. "Restore") return err
// without doing anything. Calls queue up.
func (f *Runtime) FailNext(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[method] = append(f.faults[method], fault{err: err})
}

// Hang makes the next call of method block until release is called (then
// it proceeds normally) or its context ends (then it returns the context's
// error having done nothing).
func (f *Runtime) Hang(method string) (release func()) {
	ch := make(chan struct{})
	f.mu.Lock()
	f.faults[method] = append(f.faults[method], fault{release: ch})
	f.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// Calls returns the calls so far, oldest first.
func (f *Runtime) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Touch stands for a request to the slot's workload: it bumps the
// workload's memory counter and appends a line to TouchLog in each of its
// writable volumes. It returns the new counter.
func (f *Runtime) Touch(slot string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[slot]
	if !ok || sb.crashed {
		return 0, fmt.Errorf("slot %s: touch: %w", slot, runtime.ErrNotRunning)
	}
	sb.memory++
	containers, err := sb.w.Check()
	if err != nil {
		return 0, err
	}
	// A volume several containers mount is one directory, touched once.
	touched := map[string]bool{}
	for _, c := range containers {
		for _, m := range c.Mounts {
			if m.ReadOnly || touched[m.Host] {
				continue
			}
			touched[m.Host] = true
			if err := touch(m.Host, sb.memory); err != nil {
				return 0, fmt.Errorf("slot %s: touch: %w", slot, err)
			}
		}
	}
	return sb.memory, nil
}

func touch(dir string, n int64) error {
	file, err := os.OpenFile(filepath.Join(dir, TouchLog), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(file, "touch %d\n", n)
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	return err
}

// Crash makes the slot's workload die: it stops running, but its sandbox
// stays (the slot is busy) until Terminate, as with runsc.
func (f *Runtime) Crash(slot string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, ok := f.sandboxes[slot]; ok {
		sb.crashed = true
	}
}

// Workload returns the actor UID running in slot, if any.
func (f *Runtime) Workload(slot string) (actorUID string, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[slot]
	if !ok {
		return "", false
	}
	return sb.w.ActorUID, true
}

// enter records the call and applies the oldest pending fault of its method.
func (f *Runtime) enter(ctx context.Context, c Call) error {
	f.mu.Lock()
	f.calls = append(f.calls, c)
	var ft fault
	if q := f.faults[c.Method]; len(q) > 0 {
		ft, f.faults[c.Method] = q[0], q[1:]
	}
	f.mu.Unlock()
	if ft.release != nil {
		select {
		case <-ft.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return ft.err
}

// Class implements runtime.Runtime.
func (f *Runtime) Class() string { return Class }

// Run implements runtime.Runtime.
func (f *Runtime) Run(ctx context.Context, slot runtime.Slot, w runtime.Workload) error {
	if err := f.enter(ctx, Call{Method: "Run", Slot: slot.Name, ActorUID: w.ActorUID}); err != nil {
		return err
	}
	return f.start(slot, w, nil)
}

// Warm implements runtime.Runtime. What a warm slot was made for is the
// actor and its workload's shape (see shapeOf); a restore of the same
// shape uses it, a run only of the same actor too.
func (f *Runtime) Warm(ctx context.Context, slot runtime.Slot, w runtime.Workload) error {
	if err := f.enter(ctx, Call{Method: "Warm", Slot: slot.Name, ActorUID: w.ActorUID}); err != nil {
		return err
	}
	if slot.Name == "" {
		return errors.New("slot has no name")
	}
	c, err := w.CheckShape()
	if err != nil {
		return fmt.Errorf("slot %s: warm: %w", slot.Name, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, ok := f.sandboxes[slot.Name]; ok {
		return fmt.Errorf("slot %s: warm for actor %s: %w (sandbox %s)", slot.Name, w.ActorUID, runtime.ErrBusy, sb.id)
	}
	f.warm[slot.Name] = warmed{w.Actor, shapeOf(c)}
	return nil
}

// Warmed returns whether slot is warm for w's actor and shape.
func (f *Runtime) Warmed(slot string, w runtime.Workload) bool {
	c, err := w.CheckShape()
	if err != nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	wm, ok := f.warm[slot]
	return ok && wm.serves(w, shapeOf(c), false)
}

// shapeOf is what a warm sandbox fixes of a workload's containers:
// everything their specs hold but the host directories of mounts.
func shapeOf(containers []runtime.Checked) string {
	type mount struct {
		Guest    string
		ReadOnly bool
	}
	type container struct {
		Rootfs    string
		Container any
		Mounts    []mount
	}
	shape := make([]container, 0, len(containers))
	for _, c := range containers {
		mounts := make([]mount, 0, len(c.Mounts))
		for _, m := range c.Mounts {
			mounts = append(mounts, mount{m.Guest, m.ReadOnly})
		}
		shape = append(shape, container{c.Rootfs, c.Container, mounts})
	}
	b, _ := json.Marshal(shape)
	return string(b)
}

// Restore implements runtime.Runtime.
func (f *Runtime) Restore(ctx context.Context, slot runtime.Slot, w runtime.Workload, imageDir string) error {
	if err := f.enter(ctx, Call{Method: "Restore", Slot: slot.Name, ActorUID: w.ActorUID, ImageDir: imageDir}); err != nil {
		return err
	}
	if imageDir == "" {
		return fmt.Errorf("slot %s: restore actor %s: image dir: %w", slot.Name, w.ActorUID, runtime.ErrNoImage)
	}
	data, err := os.ReadFile(filepath.Join(imageDir, imageFile))
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("slot %s: restore actor %s from %s: %w", slot.Name, w.ActorUID, imageDir, runtime.ErrNoImage)
	}
	if err != nil {
		return fmt.Errorf("slot %s: restore actor %s: %w", slot.Name, w.ActorUID, err)
	}
	var img image
	if err := json.Unmarshal(data, &img); err != nil {
		return fmt.Errorf("slot %s: restore actor %s: image %s: %w", slot.Name, w.ActorUID, imageDir, err)
	}
	return f.start(slot, w, &img)
}

// start starts w in slot, in its warm sandbox if that was made for w's
// shape (the slot's latest Run or Restore call records it); any other warm
// sandbox goes.
func (f *Runtime) start(slot runtime.Slot, w runtime.Workload, img *image) error {
	if slot.Name == "" {
		return errors.New("slot has no name")
	}
	c, err := w.Check()
	if err != nil {
		return fmt.Errorf("slot %s: %w", slot.Name, err)
	}
	sp := specOf(c)
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, ok := f.sandboxes[slot.Name]; ok {
		return fmt.Errorf("slot %s: start actor %s: %w (sandbox %s)", slot.Name, w.ActorUID, runtime.ErrBusy, sb.id)
	}
	startedWarm := false
	if wm, ok := f.warm[slot.Name]; ok {
		delete(f.warm, slot.Name)
		startedWarm = wm.serves(w, shapeOf(c), img != nil)
		for i := len(f.calls) - 1; i >= 0; i-- {
			if call := &f.calls[i]; call.Slot == slot.Name && (call.Method == "Run" || call.Method == "Restore") {
				call.Warm = startedWarm
				break
			}
		}
	}
	var memory int64
	if img != nil {
		if err := img.Spec.matches(sp); err != nil {
			return fmt.Errorf("slot %s: restore actor %s: image was taken from another workload: %w", slot.Name, w.ActorUID, err)
		}
		memory = img.Memory
	}
	f.gen++
	f.sandboxes[slot.Name] = &sandbox{
		id: fmt.Sprintf("%s_%d", slot.Name, f.gen), w: w, spec: sp, memory: memory, started: time.Now(), startedWarm: startedWarm,
	}
	return nil
}

// StartedWarm reports whether slot's workload started in the slot's
// warm sandbox.
func (f *Runtime) StartedWarm(slot runtime.Slot) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[slot.Name]
	return ok && sb.startedWarm
}

func specOf(containers []runtime.Checked) spec {
	sp := spec{}
	for _, c := range containers {
		cs := containerSpec{Args: c.Process.Args}
		for _, m := range c.Mounts {
			cs.Mounts = append(cs.Mounts, m.Guest)
		}
		sp[c.Container.GetName()] = cs
	}
	return sp
}

// matches says why a workload of spec now cannot restore an image of
// spec old: as runsc, it wants the same containers with the same
// arguments and mount destinations.
func (old spec) matches(now spec) error {
	if len(old) != len(now) {
		return fmt.Errorf("%d containers, now %d", len(old), len(now))
	}
	for name, o := range old {
		n, ok := now[name]
		if !ok {
			return fmt.Errorf("container %q is gone", name)
		}
		if !slices.Equal(o.Args, n.Args) || !slices.Equal(o.Mounts, n.Mounts) {
			return fmt.Errorf("container %q: args %q, mounts %q; now %q, %q", name, o.Args, o.Mounts, n.Args, n.Mounts)
		}
	}
	return nil
}

// Checkpoint implements runtime.Runtime.
func (f *Runtime) Checkpoint(ctx context.Context, slot runtime.Slot, imageDir string, leaveRunning bool) error {
	if err := f.enter(ctx, Call{Method: "Checkpoint", Slot: slot.Name, ImageDir: imageDir, LeaveRunning: leaveRunning}); err != nil {
		return err
	}
	if imageDir == "" {
		return fmt.Errorf("slot %s: checkpoint: no image dir given", slot.Name)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[slot.Name]
	if !ok || sb.crashed {
		return fmt.Errorf("slot %s: checkpoint: %w", slot.Name, runtime.ErrNotRunning)
	}
	data, err := json.Marshal(image{Spec: sb.spec, Memory: sb.memory})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(imageDir, 0o755); err != nil {
		return fmt.Errorf("slot %s: checkpoint: %w", slot.Name, err)
	}
	tmp := filepath.Join(imageDir, imageFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("slot %s: checkpoint: %w", slot.Name, err)
	}
	if err := os.Rename(tmp, filepath.Join(imageDir, imageFile)); err != nil {
		return fmt.Errorf("slot %s: checkpoint: %w", slot.Name, err)
	}
	if !leaveRunning {
		delete(f.sandboxes, slot.Name)
	}
	return nil
}

// Exec implements runtime.Runtime: the command succeeds in any container
// of a running workload (FailNext("Exec", err) makes one fail).
func (f *Runtime) Exec(ctx context.Context, slot runtime.Slot, container string, cmd []string) error {
	if err := f.enter(ctx, Call{Method: "Exec", Slot: slot.Name, Container: container, Cmd: slices.Clone(cmd)}); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[slot.Name]
	if !ok || sb.crashed {
		return fmt.Errorf("slot %s: exec %q: %w", slot.Name, cmd, runtime.ErrNotRunning)
	}
	if _, ok := sb.spec[container]; !ok {
		return fmt.Errorf("slot %s: exec %q: the workload has no container %q", slot.Name, cmd, container)
	}
	return nil
}

// Terminate implements runtime.Runtime.
func (f *Runtime) Terminate(ctx context.Context, slot runtime.Slot) error {
	if err := f.enter(ctx, Call{Method: "Terminate", Slot: slot.Name}); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sandboxes, slot.Name)
	delete(f.warm, slot.Name)
	return nil
}

// Stats implements runtime.Runtime. MemoryBytes is the memory counter.
func (f *Runtime) Stats(ctx context.Context, slot runtime.Slot) (runtime.Stats, error) {
	if err := f.enter(ctx, Call{Method: "Stats", Slot: slot.Name}); err != nil {
		return runtime.Stats{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[slot.Name]
	if !ok {
		_, warm := f.warm[slot.Name]
		return runtime.Stats{Warm: warm}, nil
	}
	return runtime.Stats{Running: !sb.crashed, MemoryBytes: sb.memory, CPU: time.Since(sb.started), Started: sb.started}, nil
}

// Sandboxes implements runtime.Runtime.
func (f *Runtime) Sandboxes(ctx context.Context) ([]string, error) {
	if err := f.enter(ctx, Call{Method: "Sandboxes"}); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	slots := make([]string, 0, len(f.sandboxes)+len(f.warm))
	for name := range f.sandboxes {
		slots = append(slots, name)
	}
	for name := range f.warm {
		if _, ok := f.sandboxes[name]; !ok {
			slots = append(slots, name)
		}
	}
	slices.Sort(slots)
	return slots, nil
}
