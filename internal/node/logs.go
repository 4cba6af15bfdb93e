package node

// Actors' logs. Each slot's workload writes its containers' standard
// streams into FIFOs of the slot (runtime.Slot.Output); the node reads
// them, stamps each line with the time it read it and appends it to the
// log of the actor the slot hosts, under logs/<actor uid>/. A log is
// bounded (maxLogBytes: the current file, and the previous one once the
// current passed half of it). It travels with the actor: a checkpoint
// puts it in the snapshot (logs/ in its tree), and a restore from storage
// brings it back, so the log goes on across suspends, resumes and moves.
// The node adds its own records (stream "torpor") where the actor
// started, resumed, paused or was suspended.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/actorlog"
	"github.com/torpor-dev/torpor/internal/atomicfile"
	"github.com/torpor-dev/torpor/internal/runtime"
)

const (
	// maxLogBytes bounds an actor's log (both files, records included).
	maxLogBytes = 2 << 20
	// torporStream is the stream of the node's own records.
	torporStream = "torpor"
	// logBatch bounds the records of one Logs message.
	logBatch = 500
	// maxKeptLogs bounds the logs the node keeps of actors whose workload
	// stopped here without a checkpoint to storage (a crash, a pause):
	// past it the oldest go. Reading one of those then finds the log in
	// the actor's snapshot.
	maxKeptLogs = 64
	// drainWait bounds how long a stopping reader waits for its FIFOs to
	// empty: what a workload that just stopped left in them, or what one
	// running on (at the agent's stop) writes meanwhile.
	drainWait = 100 * time.Millisecond
)

// actorLogs keeps the logs of the actors on this node and reads the
// slots' output into them.
type actorLogs struct {
	dir    string // logs/<actor uid>/{previous,current}
	output string // output/<worker>/<i>.{out,err}
	log    *slog.Logger

	mu      sync.Mutex
	actors  map[string]*actorLog // by uid, while open
	readers map[string]*slotReader
}

func newActorLogs(dir, output string, log *slog.Logger) *actorLogs {
	return &actorLogs{dir: dir, output: output, log: log, actors: map[string]*actorLog{}, readers: map[string]*slotReader{}}
}

// outputDir is the output FIFO directory of worker, made if missing.
func (l *actorLogs) outputDir(worker string) (string, error) {
	dir := filepath.Join(l.output, worker)
	return dir, os.MkdirAll(dir, 0o700)
}

// actorLog is one actor's log, open for appending and following.
type actorLog struct {
	dir  string
	mu   sync.Mutex
	f    *os.File
	size int64
	// followers get every record appended; closed when the log closes.
	followers map[chan *torporv1.LogRecord]bool
}

func (l *actorLogs) open(uid string) (*actorLog, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.actors[uid]; a != nil {
		return a, nil
	}
	dir := filepath.Join(l.dir, uid)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "current"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	a := &actorLog{dir: dir, f: f, size: fi.Size(), followers: map[chan *torporv1.LogRecord]bool{}}
	l.actors[uid] = a
	return a, nil
}

// append writes r, rotating the files when the current one is full.
func (a *actorLog) append(r *torporv1.LogRecord) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return os.ErrClosed
	}
	line := actorlog.Encode(r)
	if a.size+int64(len(line)) > maxLogBytes/2 && a.size > 0 {
		if err := a.rotate(); err != nil {
			return err
		}
	}
	n, err := a.f.Write(line)
	a.size += int64(n)
	for ch := range a.followers {
		select {
		case ch <- r:
		default:
			// A follower that does not keep up is let go.
			delete(a.followers, ch)
			close(ch)
		}
	}
	return err
}

func (a *actorLog) rotate() error {
	if err := os.Rename(filepath.Join(a.dir, "current"), filepath.Join(a.dir, "previous")); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(a.dir, "current"), os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	a.f.Close()
	a.f, a.size = f, 0
	return nil
}

// close ends the log's followers and closes its file.
func (l *actorLogs) close(uid string) {
	l.mu.Lock()
	a := l.actors[uid]
	delete(l.actors, uid)
	l.mu.Unlock()
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for ch := range a.followers {
		close(ch)
	}
	a.followers = nil
	if a.f != nil {
		a.f.Close()
		a.f = nil
	}
}

// mark appends the node's own record to the actor's log.
func (l *actorLogs) mark(uid, format string, args ...any) {
	a, err := l.open(uid)
	if err == nil {
		err = a.append(&torporv1.LogRecord{Time: timestamppb.Now(), Stream: torporStream, Text: fmt.Appendf(nil, format, args...)})
	}
	if err != nil {
		l.log.Warn("actor log: record not written", "actor_uid", uid, "err", err)
	}
}

// slotReader reads one slot's FIFOs into its actor's log.
type slotReader struct {
	actor string
	files []*os.File
	done  sync.WaitGroup
}

// attach starts reading worker's output into the log of actor uid,
// whose containers are named in order; a reader of another actor there
// is stopped first. Reading an attached actor's again does nothing.
func (l *actorLogs) attach(worker, uid string, containers []string) {
	l.mu.Lock()
	r := l.readers[worker]
	l.mu.Unlock()
	if r != nil {
		if r.actor == uid {
			return
		}
		l.detach(worker)
	}
	a, err := l.open(uid)
	if err != nil {
		l.log.Warn("actor log: not opened", "actor_uid", uid, "err", err)
		return
	}
	dir, err := l.outputDir(worker)
	if err != nil {
		l.log.Warn("actor log: output directory", "worker", worker, "err", err)
		return
	}
	r = &slotReader{actor: uid}
	for i, name := range containers {
		for _, stream := range []string{"out", "err"} {
			f, err := openFIFO(runtime.OutputPath(dir, i, stream))
			if err != nil {
				l.log.Warn("actor log: output not read", "worker", worker, "actor_uid", uid, "err", err)
				continue
			}
			r.files = append(r.files, f)
			r.done.Go(func() { readOutput(f, a, name, map[string]string{"out": "stdout", "err": "stderr"}[stream]) })
		}
	}
	l.mu.Lock()
	l.readers[worker] = r
	l.mu.Unlock()
}

// detach stops reading worker's output, after what its FIFOs still hold
// (the workload stopped: what it wrote last is there).
func (l *actorLogs) detach(worker string) {
	l.mu.Lock()
	r := l.readers[worker]
	delete(l.readers, worker)
	l.mu.Unlock()
	if r != nil {
		r.stop()
	}
}

// detachAll stops every reader, at the agent's stop: the next agent
// reads the FIFOs of the workloads that run on.
func (l *actorLogs) detachAll() {
	l.mu.Lock()
	readers := l.readers
	l.readers = map[string]*slotReader{}
	l.mu.Unlock()
	for _, r := range readers {
		r.drain()
	}
	for _, r := range readers {
		r.stop()
	}
}

// drain lets the reader take what the FIFOs hold now, then end: once
// they are empty (a read under way has taken its bytes), or drainWait
// has passed, reads stop.
func (r *slotReader) drain() {
	deadline := time.Now().Add(drainWait)
	for _, f := range r.files {
		for time.Now().Before(deadline) && pending(f) {
			time.Sleep(time.Millisecond)
		}
	}
	for _, f := range r.files {
		f.SetReadDeadline(time.Now())
	}
}

// pending reports whether the FIFO f holds bytes no read has taken
// (TIOCINQ: FIONREAD, which a pipe answers too); an
// error reading it counts as yes (drain then waits its whole bound).
func pending(f *os.File) bool {
	conn, err := f.SyscallConn()
	if err != nil {
		return true
	}
	n := 1
	if cerr := conn.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); cerr != nil || err != nil {
		return true
	}
	return n > 0
}

// stop drains the reader and waits for it to end.
func (r *slotReader) stop() {
	r.drain()
	r.done.Wait()
	for _, f := range r.files {
		f.Close()
	}
}

// openFIFO opens the FIFO at path (made if missing) for reading, and for
// writing too, so a read waits for data instead of seeing the end when
// no workload writes.
func openFIFO(path string) (*os.File, error) {
	if err := unix.Mkfifo(path, 0o600); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, err
	}
	return os.OpenFile(path, os.O_RDWR, 0)
}

// readOutput appends what f delivers to a as records of container's
// stream, a line each (longer ones, and a line's end not there yet, as
// partial records), until f is closed or its read deadline passes.
func readOutput(f io.Reader, a *actorLog, container, stream string) {
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		chunk := buf[:n]
		now := timestamppb.Now()
		for len(chunk) > 0 {
			line, rest, complete := bytes.Cut(chunk, []byte("\n"))
			if len(line) > actorlog.MaxLineBytes {
				line, rest, complete = line[:actorlog.MaxLineBytes], chunk[actorlog.MaxLineBytes:], false
			}
			a.append(&torporv1.LogRecord{Time: now, Container: container, Stream: stream, Text: bytes.Clone(line), Partial: !complete})
			chunk = rest
		}
		if err != nil {
			return
		}
	}
}

// read returns the records of actor uid's log that match f, oldest
// first, and with follow a channel of those appended from then on.
func (l *actorLogs) read(uid string, f actorlog.Filter, follow bool) ([]*torporv1.LogRecord, chan *torporv1.LogRecord, error) {
	a, err := l.open(uid)
	if err != nil {
		return nil, nil, err
	}
	// Under the log's lock: no record is both read and followed, or
	// neither.
	a.mu.Lock()
	defer a.mu.Unlock()
	recs, err := readLogFiles(a.dir, f)
	if err != nil {
		return nil, nil, err
	}
	if !follow {
		return recs, nil, nil
	}
	if a.followers == nil {
		// Closed meanwhile: the actor stopped.
		return recs, nil, nil
	}
	ch := make(chan *torporv1.LogRecord, 1024)
	a.followers[ch] = true
	return recs, ch, nil
}

// readKept returns the records that match f of the log this node keeps
// of actor uid, whose workload stopped here; fs.ErrNotExist if it keeps
// none.
func (l *actorLogs) readKept(uid string, f actorlog.Filter) ([]*torporv1.LogRecord, error) {
	dir := filepath.Join(l.dir, uid)
	if _, err := os.Stat(dir); err != nil {
		return nil, err
	}
	l.mu.Lock()
	a := l.actors[uid]
	l.mu.Unlock()
	if a != nil {
		a.mu.Lock()
		defer a.mu.Unlock()
	}
	return readLogFiles(dir, f)
}

func readLogFiles(dir string, f actorlog.Filter) ([]*torporv1.LogRecord, error) {
	var recs []*torporv1.LogRecord
	for _, name := range actorlog.Files {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		recs = actorlog.Parse(recs, b, f)
	}
	return recs, nil
}

// unfollow stops sending to ch.
func (l *actorLogs) unfollow(uid string, ch chan *torporv1.LogRecord) {
	l.mu.Lock()
	a := l.actors[uid]
	l.mu.Unlock()
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.followers[ch] {
		delete(a.followers, ch)
		close(ch)
	}
}

// capture copies actor uid's log into a snapshot tree.
func (l *actorLogs) capture(uid, tree string) error {
	l.mu.Lock()
	a := l.actors[uid]
	l.mu.Unlock()
	if a != nil {
		a.mu.Lock()
		defer a.mu.Unlock()
	}
	return copyLogFiles(filepath.Join(l.dir, uid), filepath.Join(tree, actorlog.Dir))
}

// restore replaces actor uid's log on this node with the one in a
// snapshot tree, when it holds one.
func (l *actorLogs) restore(uid, tree string) error {
	from := filepath.Join(tree, actorlog.Dir)
	if _, err := os.Stat(from); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	l.close(uid)
	to := filepath.Join(l.dir, uid)
	if err := os.RemoveAll(to); err != nil {
		return err
	}
	return copyLogFiles(from, to)
}

// keep closes actor uid's log after the node's record of why its
// workload stopped, and keeps it for reading (readKept), within
// maxKeptLogs.
func (l *actorLogs) keep(uid, format string, args ...any) {
	l.mark(uid, format, args...)
	l.close(uid)
	if err := l.prune(); err != nil {
		l.log.Warn("actor logs: kept logs not pruned", "err", err)
	}
}

// prune removes the oldest closed logs beyond maxKeptLogs.
func (l *actorLogs) prune() error {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return err
	}
	type kept struct {
		uid  string
		time time.Time
	}
	var closed []kept
	l.mu.Lock()
	for _, e := range entries {
		if l.actors[e.Name()] != nil {
			continue
		}
		fi, err := os.Stat(filepath.Join(l.dir, e.Name(), "current"))
		if err != nil {
			continue
		}
		closed = append(closed, kept{e.Name(), fi.ModTime()})
	}
	l.mu.Unlock()
	if len(closed) <= maxKeptLogs {
		return nil
	}
	slices.SortFunc(closed, func(a, b kept) int { return b.time.Compare(a.time) })
	var errs []error
	for _, k := range closed[maxKeptLogs:] {
		errs = append(errs, os.RemoveAll(filepath.Join(l.dir, k.uid)))
	}
	return errors.Join(errs...)
}

// remove deletes actor uid's log from this node.
func (l *actorLogs) remove(uid string) error {
	l.close(uid)
	return os.RemoveAll(filepath.Join(l.dir, uid))
}

func copyLogFiles(from, to string) error {
	if err := os.MkdirAll(to, 0o700); err != nil {
		return err
	}
	for _, name := range actorlog.Files {
		b, err := os.ReadFile(filepath.Join(from, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := atomicfile.Write(filepath.Join(to, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// containerNames are w's containers' names, in order.
func containerNames(w *torporv1.Workload) []string {
	var names []string
	for _, c := range w.GetTemplate().GetContainers() {
		names = append(names, c.GetName())
	}
	return names
}
