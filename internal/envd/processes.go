package envd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	pb "github.com/torpor-dev/torpor/api/gen/envd/process"
)

// outputGrace is how long a process's output may still arrive after it
// exited: a child it left in the background may hold its output open,
// which would otherwise keep the process from ever ending for its
// clients.
const outputGrace = 2 * time.Second

// processTable is the processes the daemon started that still run, by
// pid. It lives in the daemon's memory, so it is checkpointed with the
// sandbox and its processes.
type processTable struct {
	log *slog.Logger

	mu    sync.Mutex
	byPID map[uint32]*process
}

func newProcessTable(log *slog.Logger) *processTable {
	return &processTable{log: log, byPID: map[uint32]*process{}}
}

// process is one started process and the clients following it.
type process struct {
	pid    uint32
	tag    string
	config *pb.ProcessConfig
	cmd    *exec.Cmd
	// terminal is the pseudo-terminal's controlling side, nil without
	// one; its input and output are the process's.
	terminal *os.File

	mu sync.Mutex
	// stdin is the process's standard input, nil when it has none or it
	// was closed.
	stdin io.WriteCloser
	subs  map[*subscriber]struct{}
	// end is how it ended, set before done closes.
	end  *pb.ProcessEvent_EndEvent
	done chan struct{}
}

// subscriber is one stream following a process's output.
type subscriber struct {
	events chan *pb.ProcessEvent
	// gone closes when the stream ends: output no longer waits for it.
	gone <-chan struct{}
}

// startSpec is a process to start for a call.
type startSpec struct {
	config *pb.ProcessConfig
	tag    string
	stdin  bool
	pty    *pb.PTY
	user   identity
	env    []string
}

// start runs spec and subscribes a follower before any output can be
// missed. gone is the follower's stream's end.
func (t *processTable) start(spec startSpec, gone <-chan struct{}) (*process, *subscriber, error) {
	cfg := spec.config
	if cfg.GetCmd() == "" {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd: required"))
	}
	cwd := spec.user.dir()
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		cwd = spec.user.abs(cfg.GetCwd())
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("process.cwd %s: not a directory in the sandbox", cwd))
	}
	path := cfg.GetCmd()
	// The SDK runs every command with /bin/bash; an image without bash
	// gets its POSIX shell, which takes the same -l -c.
	if path == "/bin/bash" {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			path = "/bin/sh"
		}
	}
	cmd := exec.Command(path, cfg.GetArgs()...)
	cmd.Dir, cmd.Env = cwd, spec.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: spec.user.credential()}
	p := &process{tag: spec.tag, config: cfg, cmd: cmd, subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
	sub := p.subscribe(gone)
	var err error
	if spec.pty != nil {
		size := spec.pty.GetSize()
		p.terminal, err = pty.StartWithAttrs(cmd, &pty.Winsize{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())}, &syscall.SysProcAttr{Setsid: true, Setctty: true, Credential: spec.user.credential()})
	} else {
		// Its own process group, so a signal reaches what it started too.
		cmd.SysProcAttr.Setpgid = true
		cmd.Stdout, cmd.Stderr = p.output(false), p.output(true)
		cmd.WaitDelay = outputGrace
		if spec.stdin {
			if p.stdin, err = cmd.StdinPipe(); err != nil {
				return nil, nil, connect.NewError(connect.CodeInternal, fmt.Errorf("process %s: stdin: %w", cfg.GetCmd(), err))
			}
		}
		err = cmd.Start()
	}
	if err != nil {
		code := connect.CodeInternal
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, exec.ErrNotFound) {
			code = connect.CodeNotFound
		} else if errors.Is(err, os.ErrPermission) {
			code = connect.CodePermissionDenied
		}
		return nil, nil, connect.NewError(code, fmt.Errorf("start process %s: %w", cfg.GetCmd(), err))
	}
	p.pid = uint32(cmd.Process.Pid)
	t.mu.Lock()
	t.byPID[p.pid] = p
	t.mu.Unlock()
	go t.wait(p)
	return p, sub, nil
}

// wait reaps p, records how it ended, and forgets it.
func (t *processTable) wait(p *process) {
	var readDone chan struct{}
	if p.terminal != nil {
		readDone = make(chan struct{})
		go func() {
			defer close(readDone)
			io.Copy(p.output(false), p.terminal)
		}()
	}
	err := p.cmd.Wait()
	if readDone != nil {
		select {
		case <-readDone:
		case <-time.After(outputGrace):
		}
		p.terminal.Close()
		<-readDone
	}
	end := &pb.ProcessEvent_EndEvent{Status: p.cmd.ProcessState.String()}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Exited() {
		end.ExitCode, end.Exited = int32(ws.ExitStatus()), true
	} else {
		// The SDK's error for a command that did not exit says how it
		// ended.
		end.ExitCode, end.Error = -1, &end.Status
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) && !errors.Is(err, exec.ErrWaitDelay) {
		msg := err.Error()
		end.Error = &msg
	}
	t.mu.Lock()
	delete(t.byPID, p.pid)
	t.mu.Unlock()
	p.mu.Lock()
	p.end = end
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	close(p.done)
	p.mu.Unlock()
	t.log.Debug("process ended", "pid", p.pid, "status", end.Status)
}

// find is the running process sel names.
func (t *processTable) find(sel *pb.ProcessSelector) (*process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := t.byPID[s.Pid]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", s.Pid))
	case *pb.ProcessSelector_Tag:
		for _, p := range t.byPID {
			if p.tag == s.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", s.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process: a pid or a tag is required"))
}

// list describes the running processes, by pid.
func (t *processTable) list() []*pb.ProcessInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*pb.ProcessInfo, 0, len(t.byPID))
	for _, pid := range slices.Sorted(maps.Keys(t.byPID)) {
		p := t.byPID[pid]
		info := &pb.ProcessInfo{Pid: pid, Config: p.config}
		if p.tag != "" {
			info.Tag = &p.tag
		}
		out = append(out, info)
	}
	return out
}

// subscribe adds a follower of p's output from now on.
func (p *process) subscribe(gone <-chan struct{}) *subscriber {
	s := &subscriber{events: make(chan *pb.ProcessEvent, 64), gone: gone}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	return s
}

func (p *process) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// publish hands an event to every follower, waiting for each that is
// still there: output is never dropped for a follower, and a slow one
// slows the process as a full pipe would.
func (p *process) publish(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.events <- ev:
		case <-s.gone:
		}
	}
}

// output is a writer publishing what the process writes to its stdout
// or stderr, or to its terminal (as pty data), chunk by chunk as written.
func (p *process) output(stderr bool) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		data := slices.Clone(b)
		ev := &pb.ProcessEvent_DataEvent{}
		switch {
		case p.terminal != nil:
			ev.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: data}
		case stderr:
			ev.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: data}
		default:
			ev.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: data}
		}
		p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: ev}})
		return len(b), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// signal sends sig to p's process group (all it started), or to p alone
// when it has none of its own.
func (p *process) signal(sig syscall.Signal) error {
	if err := syscall.Kill(-int(p.pid), sig); err == nil {
		return nil
	}
	if err := syscall.Kill(int(p.pid), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("signal process %d: %w", p.pid, err))
	}
	return nil
}

// write feeds p's stdin (or its terminal, with pty).
func (p *process) write(in *pb.ProcessInput) error {
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Pty:
		if p.terminal == nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal", p.pid))
		}
		_, err := p.terminal.Write(v.Pty)
		return ioError(p.pid, err)
	case *pb.ProcessInput_Stdin:
		if p.terminal != nil {
			_, err := p.terminal.Write(v.Stdin)
			return ioError(p.pid, err)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.stdin == nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d: stdin is closed or was not asked for (start it with stdin)", p.pid))
		}
		_, err := p.stdin.Write(v.Stdin)
		return ioError(p.pid, err)
	}
	return connect.NewError(connect.CodeInvalidArgument, errors.New("input: stdin or pty is required"))
}

func ioError(pid uint32, err error) error {
	if err == nil {
		return nil
	}
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("input of process %d: %w", pid, err))
}

// closeStdin gives p end of file.
func (p *process) closeStdin() error {
	if p.terminal != nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d runs on a terminal: send its end-of-file character (^D) as input", p.pid))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	if err != nil {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("close stdin of process %d: %w", p.pid, err))
	}
	return nil
}

// resize changes p's terminal size.
func (p *process) resize(size *pb.PTY_Size) error {
	if p.terminal == nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal", p.pid))
	}
	if err := pty.Setsize(p.terminal, &pty.Winsize{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())}); err != nil {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("resize the terminal of process %d: %w", p.pid, err))
	}
	return nil
}

// follow sends p's events to a stream: its start first, then its output
// as the subscriber got it, then its end; with keepalive, an empty event
// whenever that long passed without one. It returns when p ended or ctx
// did.
func (p *process) follow(ctx context.Context, sub *subscriber, keepalive time.Duration, send func(*pb.ProcessEvent) error) error {
	defer p.unsubscribe(sub)
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	var tick <-chan time.Time
	if keepalive > 0 {
		t := time.NewTicker(keepalive)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev := <-sub.events:
			if err := send(ev); err != nil {
				return err
			}
		case <-tick:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-p.done:
			// All output was published before done closed.
			for len(sub.events) > 0 {
				if err := send(<-sub.events); err != nil {
					return err
				}
			}
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: p.end}})
		case <-ctx.Done():
			return contextError(ctx)
		}
	}
}

// contextError is the Connect error of a call whose context ended.
func contextError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}
