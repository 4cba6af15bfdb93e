package slotgate

// Freezing (IdlePolicy.freeze_seconds, the idle ladder's first rung). A
// slot whose occupant was given a Freeze is paused in place once nothing
// moved through its connections and nothing held it for Freeze.After:
// its sandbox stops taking CPU and keeps its memory, its worker and its
// connections. The gate is in the path of every routed byte, so it is
// the one that thaws: a connection admitted, or a byte read from either
// side of one, thaws the slot before the byte is passed on; the node
// agent holds the slot awake (Hold) around what reaches the sandbox
// another way (exec, files, a checkpoint, a terminate).
//
// gVisor's pauses nest and a resume without a pause panics the sandbox,
// so one owner, the gate, keeps each slot's state, and a marker file
// (Options.MarkDir) says which slots it left paused: a gate started again
// (or an agent with the gate inside it) takes the state over from it. The
// marker is written before the pause and removed after the resume, so a
// gate killed between the two errs on a resume the sandbox did not need,
// which ends it (its exit is seen and reported), never on a sandbox left
// paused with no one knowing.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Pauser pauses and resumes one sandbox (gvisor: its control server).
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// Freeze is how a slot's occupant is frozen.
type Freeze struct {
	// After is the idle time before the freeze; 0: never.
	After time.Duration
	// Control names the occupant's sandbox to Options.Pausers (gvisor:
	// its control socket).
	Control string
}

// Change is a slot frozen or thawed, as Options.Notify hears of it.
type Change struct {
	Worker   string
	ActorUID string
	Frozen   bool
	Time     time.Time
}

// Options configure a gate's freezing; the zero value freezes nothing.
type Options struct {
	// Pausers returns the pauser of the sandbox Freeze.Control names.
	Pausers func(control string) Pauser
	// MarkDir keeps a marker per frozen slot (see above).
	MarkDir string
	// Notify hears of every freeze and thaw, in order per slot; it must
	// not block.
	Notify func(Change)
}

// freezeTick is how often the gate looks for slots to freeze: a freeze
// comes up to this late, which an idle time of seconds does not notice.
const freezeTick = 200 * time.Millisecond

// pauseTimeout bounds one pause or resume call.
const pauseTimeout = 10 * time.Second

// freezer is one occupant's freeze state.
type freezer struct {
	cfg    Freeze
	pauser Pauser
	// active is when a byte last moved or a hold ended (unix nanos).
	active atomic.Int64
	// asleep is set before a pause and cleared after the resume: a byte
	// read while it is set waits for thaw.
	asleep atomic.Bool

	mu      sync.Mutex // serializes pause, resume and holds
	frozen  bool
	holds   int
	retired bool // the slot moved on: its sandbox is not to be touched
}

func (f *freezer) touch() { f.active.Store(time.Now().UnixNano()) }

// freezes says whether cfg freezes anything on this gate.
func (g *Gate) freezes(cfg Freeze) bool {
	return cfg.After > 0 && cfg.Control != "" && g.opts.Pausers != nil
}

// freezesAs says whether f (nil: none) is what cfg makes.
func (g *Gate) freezesAs(f *freezer, cfg Freeze) bool {
	if f == nil {
		return !g.freezes(cfg)
	}
	return f.cfg == cfg
}

// newFreezer returns the freezer of occupant occ, frozen already when
// the marker a previous gate left says so.
func (g *Gate) newFreezer(worker, actorUID string, cfg Freeze) *freezer {
	if !g.freezes(cfg) {
		g.unmark(worker)
		return nil
	}
	f := &freezer{cfg: cfg, pauser: g.opts.Pausers(cfg.Control)}
	f.touch()
	if g.marked(worker) == marker(actorUID, cfg.Control) {
		f.frozen = true
		f.asleep.Store(true)
		g.log.Info("slot frozen by a previous gate: taken over", "worker", worker, "actor_uid", actorUID)
	} else {
		g.unmark(worker)
	}
	return f
}

// retire lets go of f's slot, which moved on: a frozen sandbox is thawed
// first, since what still has it (the capture of a checkpoint, a
// terminate that deletes its containers) needs it running, and f never
// touches it again.
func (g *Gate) retire(worker string, f *freezer) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		ctx, cancel := context.WithTimeout(context.Background(), pauseTimeout)
		defer cancel()
		// A sandbox already gone fails the resume: nothing to thaw.
		if err := f.pauser.Resume(ctx); err != nil {
			g.log.Warn("slot that changed hands not thawed", "worker", worker, "err", err)
		}
		f.frozen = false
	}
	f.retired = true
	f.asleep.Store(false)
	g.unmark(worker)
}

// awake thaws occ's slot if it is frozen, or is being frozen, before
// traffic passes.
func (g *Gate) awake(worker string, occ *occupant) {
	f := occ.freeze.Load()
	if f == nil {
		return
	}
	f.touch()
	if f.asleep.Load() {
		f.mu.Lock()
		err := g.thawLocked(worker, occ.actorUID, f)
		f.mu.Unlock()
		if err != nil {
			g.log.Error("slot not thawed for traffic", "worker", worker, "actor_uid", occ.actorUID, "err", err)
		}
	}
}

// thawLocked resumes f's sandbox if it is frozen; f.mu is held.
func (g *Gate) thawLocked(worker, actorUID string, f *freezer) error {
	if !f.frozen || f.retired {
		f.asleep.Store(false)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), pauseTimeout)
	defer cancel()
	if err := f.pauser.Resume(ctx); err != nil {
		return fmt.Errorf("worker %s: thaw: %w", worker, err)
	}
	f.frozen = false
	f.asleep.Store(false)
	f.touch()
	g.unmark(worker)
	g.notify(Change{Worker: worker, ActorUID: actorUID, Frozen: false, Time: time.Now()})
	return nil
}

// Hold thaws worker's slot if it is frozen and keeps it from freezing
// until release is called (the agent's exec, file access, checkpoint or
// terminate). A slot that hosts nothing, or does not freeze, holds
// trivially.
func (g *Gate) Hold(worker string) (release func(), err error) {
	g.mu.Lock()
	occ := g.slots[worker]
	g.mu.Unlock()
	if occ == nil || occ.freeze.Load() == nil {
		return func() {}, nil
	}
	f := occ.freeze.Load()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := g.thawLocked(worker, occ.actorUID, f); err != nil {
		return nil, err
	}
	f.holds++
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.holds--
			f.mu.Unlock()
			f.touch()
		})
	}, nil
}

// freezeIdle freezes every slot idle for its Freeze.After.
func (g *Gate) freezeIdle(now time.Time) {
	type due struct {
		worker string
		occ    *occupant
	}
	var dues []due
	g.mu.Lock()
	for w, occ := range g.slots {
		if f := occ.freeze.Load(); f != nil && !f.asleep.Load() && now.Sub(time.Unix(0, f.active.Load())) >= f.cfg.After && !occ.owesAnswer() {
			dues = append(dues, due{w, occ})
		}
	}
	g.mu.Unlock()
	for _, d := range dues {
		if err := g.freeze(d.worker, d.occ, now); err != nil {
			g.log.Error("slot not frozen", "worker", d.worker, "actor_uid", d.occ.actorUID, "err", err)
		}
	}
}

// owesAnswer says whether a connection's last bytes came from the
// router's side: a request the workload is still working on (a long
// computation, a call it waits for) must not be frozen under it, however
// long it takes. g.mu is held.
func (occ *occupant) owesAnswer() bool {
	for p := range occ.conns {
		if p.asked.Load() > p.answered.Load() {
			return true
		}
	}
	return false
}

// freeze pauses occ's sandbox unless it was active after now minus its
// idle time or is held. asleep is set before activity is read again, and
// traffic sets activity before it reads asleep: traffic either cancels
// the freeze or waits for it and thaws.
func (g *Gate) freeze(worker string, occ *occupant, now time.Time) error {
	f := occ.freeze.Load()
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen || f.retired || f.holds > 0 {
		return nil
	}
	f.asleep.Store(true)
	if now.Sub(time.Unix(0, f.active.Load())) < f.cfg.After {
		f.asleep.Store(false)
		return nil
	}
	if err := g.mark(worker, marker(occ.actorUID, f.cfg.Control)); err != nil {
		f.asleep.Store(false)
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), pauseTimeout)
	defer cancel()
	if err := f.pauser.Pause(ctx); err != nil {
		f.asleep.Store(false)
		g.unmark(worker)
		return fmt.Errorf("freeze: %w", err)
	}
	f.frozen = true
	g.log.Info("slot frozen", "worker", worker, "actor_uid", occ.actorUID, "idle", f.cfg.After)
	g.notify(Change{Worker: worker, ActorUID: occ.actorUID, Frozen: true, Time: time.Now()})
	return nil
}

// States returns, for every slot whose occupant freezes, a change that
// says whether it is frozen now: what a newly attached listener hears
// first (it may have missed changes).
func (g *Gate) States() []Change {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []Change
	for w, occ := range g.slots {
		f := occ.freeze.Load()
		if f == nil {
			continue
		}
		f.mu.Lock()
		out = append(out, Change{Worker: w, ActorUID: occ.actorUID, Frozen: f.frozen, Time: time.Now()})
		f.mu.Unlock()
	}
	return out
}

func (g *Gate) notify(c Change) {
	if g.opts.Notify != nil {
		g.opts.Notify(c)
	}
}

// freezeLoop freezes idle slots until ctx ends.
func (g *Gate) freezeLoop(ctx context.Context) {
	if g.opts.Pausers == nil {
		return
	}
	t := time.NewTicker(freezeTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			g.freezeIdle(now)
		}
	}
}

func marker(actorUID, control string) string { return actorUID + " " + control }

func (g *Gate) markPath(worker string) string { return filepath.Join(g.opts.MarkDir, worker) }

func (g *Gate) marked(worker string) string {
	if g.opts.MarkDir == "" {
		return ""
	}
	b, err := os.ReadFile(g.markPath(worker))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// mark records that worker's sandbox is (about to be) paused, durably.
func (g *Gate) mark(worker, m string) error {
	if g.opts.MarkDir == "" {
		return nil
	}
	if err := os.MkdirAll(g.opts.MarkDir, 0o700); err != nil {
		return fmt.Errorf("freeze marker: %w", err)
	}
	f, err := os.OpenFile(g.markPath(worker), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("freeze marker: %w", err)
	}
	_, err = f.WriteString(m + "\n")
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

func (g *Gate) unmark(worker string) {
	if g.opts.MarkDir == "" {
		return
	}
	if err := os.Remove(g.markPath(worker)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		g.log.Warn("freeze marker not removed", "worker", worker, "err", err)
	}
}

// ThawMarked resumes every sandbox the freeze markers in dir say a gate
// left paused, and removes the markers: what a node's cleanup does
// before it deletes sandboxes, which a paused one would not let go of.
// It returns the workers thawed; a sandbox already gone is not an
// error (nothing is paused any more).
func ThawMarked(ctx context.Context, dir string, pausers func(control string) Pauser) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("freeze markers: %w", err)
	}
	var thawed []string
	var errs []error
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("freeze marker: %w", err))
			continue
		}
		_, control, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
		if ok && control != "" {
			if err := pausers(control).Resume(ctx); err == nil {
				thawed = append(thawed, e.Name())
			}
		}
		if err := os.Remove(path); err != nil {
			errs = append(errs, fmt.Errorf("freeze marker: %w", err))
		}
	}
	return thawed, errors.Join(errs...)
}
