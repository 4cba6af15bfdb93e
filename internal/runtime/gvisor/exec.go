package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/creack/pty"

	"github.com/torpor-dev/torpor/internal/runtime"
)

// Exec implements runtime.Runtime: ExecStream, keeping the output for the
// error.
func (r *Runtime) Exec(ctx context.Context, slot runtime.Slot, container string, cmd []string) error {
	var out bytes.Buffer
	code, err := r.ExecStream(ctx, slot, runtime.ExecSpec{Container: container, Command: cmd, Stdout: &out, Stderr: &out})
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("slot %s: exec %q in container %s: exit status %d: %s", slot.Name, cmd, container, code, lastBytes(out.Bytes(), 2048))
	}
	return nil
}

// ExecStream implements runtime.Runtime with runsc exec, which runs the
// process as the container's own process runs. runsc exec exits with the
// process's status (128+N for signal N), and gives the process a terminal
// when its own standard streams are one.
func (r *Runtime) ExecStream(ctx context.Context, slot runtime.Slot, p runtime.ExecSpec) (int, error) {
	if err := checkSlotName(slot.Name); err != nil {
		return 0, fmt.Errorf("exec: %w", err)
	}
	if len(p.Command) == 0 {
		return 0, fmt.Errorf("slot %s: exec in container %q: no command given", slot.Name, p.Container)
	}
	id, err := r.containerID(slot.Name, p.Container)
	if err != nil {
		return 0, fmt.Errorf("slot %s: exec %q: %w", slot.Name, p.Command, err)
	}
	// The process's pid in the sandbox, so that a caller who leaves ends
	// it: killing runsc exec alone would leave it running there.
	pidFile, err := os.CreateTemp("", "torpor-exec-pid-")
	if err != nil {
		return 0, fmt.Errorf("slot %s: exec %q: %w", slot.Name, p.Command, err)
	}
	pidFile.Close()
	defer os.Remove(pidFile.Name())
	c := r.command(ctx, append([]string{"exec", "--internal-pid-file=" + pidFile.Name(), id}, p.Command...)...)
	c.Cancel = func() error {
		r.killGuest(id, pidFile.Name())
		return c.Process.Kill()
	}
	start := startPiped
	if p.TTY {
		start = startOnTerminal
	}
	wait, err := start(c, p)
	if err != nil {
		return 0, fmt.Errorf("slot %s: exec %q in container %q: %w", slot.Name, p.Command, p.Container, err)
	}
	err = wait()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case ctx.Err() != nil:
		return 0, fmt.Errorf("slot %s: exec %q in container %q: %w", slot.Name, p.Command, p.Container, context.Cause(ctx))
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		return exit.ExitCode(), nil
	case errors.As(err, &exit):
		// runsc exec itself was killed.
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
	}
	return 0, fmt.Errorf("slot %s: exec %q in container %q: %w", slot.Name, p.Command, p.Container, err)
}

// killGuest kills the process of container id whose sandbox pid runsc
// exec wrote to pidFile, if it did.
func (r *Runtime) killGuest(id, pidFile string) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	if _, err := r.output(ctx, "kill", "--pid="+strconv.Itoa(pid), id, "KILL"); err != nil {
		r.log.Warn("exec: the process of a caller who left was not killed", "container", id, "pid", pid, "err", err)
	}
}

// startPiped starts c with p's streams as pipes.
func startPiped(c *exec.Cmd, p runtime.ExecSpec) (wait func() error, err error) {
	c.Stdout, c.Stderr = p.Stdout, p.Stderr
	// A process the command left in the background would hold the pipes.
	c.WaitDelay = time.Second
	var stdin io.WriteCloser
	if p.Stdin != nil {
		if stdin, err = c.StdinPipe(); err != nil {
			return nil, err
		}
	}
	if err := c.Start(); err != nil {
		return nil, err
	}
	if stdin != nil {
		// Not waited for: the reader is the caller's, and may block past
		// the process's end (c.Wait closes the pipe).
		go func() {
			io.Copy(stdin, p.Stdin)
			stdin.Close()
		}()
	}
	return c.Wait, nil
}

// terminalDrain bounds how long the end of a terminal's output is waited
// for once its process exited: a process it started in the background
// may hold the terminal.
const terminalDrain = time.Second

// startOnTerminal starts c on a new pseudo-terminal of p.Size as its
// controlling terminal, which runsc exec hands to the process.
func startOnTerminal(c *exec.Cmd, p runtime.ExecSpec) (wait func() error, err error) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		return nil, fmt.Errorf("terminal: %w", err)
	}
	if err := pty.Setsize(ptmx, winsize(p.Size)); err != nil {
		ptmx.Close()
		tty.Close()
		return nil, fmt.Errorf("terminal size: %w", err)
	}
	c.Stdin, c.Stdout, c.Stderr = tty, tty, tty
	c.SysProcAttr.Setsid, c.SysProcAttr.Setctty, c.SysProcAttr.Ctty = true, true, 0
	err = c.Start()
	tty.Close()
	if err != nil {
		ptmx.Close()
		return nil, err
	}
	output := make(chan struct{})
	go func() {
		// Ends with EIO once no process holds the terminal any more.
		io.Copy(p.Stdout, ptmx)
		close(output)
	}()
	if p.Stdin != nil {
		go io.Copy(ptmx, p.Stdin)
	}
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case size, ok := <-p.Resize:
				if !ok {
					return
				}
				pty.Setsize(ptmx, winsize(size))
			case <-stop:
				return
			}
		}
	}()
	return func() error {
		err := c.Wait()
		select {
		case <-output:
		case <-time.After(terminalDrain):
		}
		close(stop)
		ptmx.Close()
		<-output
		return err
	}, nil
}

func winsize(s runtime.TerminalSize) *pty.Winsize {
	if s.Rows == 0 || s.Cols == 0 {
		s = runtime.TerminalSize{Rows: 24, Cols: 80}
	}
	return &pty.Winsize{Rows: s.Rows, Cols: s.Cols}
}

// containerID is the runsc id of the named container of slot's running
// sandbox; no name is its first container.
func (r *Runtime) containerID(slot, name string) (string, error) {
	defer r.lock(slot)()
	ids, _, err := r.sandboxes(slot)
	if err != nil {
		return "", err
	}
	if len(ids) != 1 {
		return "", fmt.Errorf("%w (%d sandboxes)", runtime.ErrNotRunning, len(ids))
	}
	id := ids[0]
	dir := r.bundleDir(slot, id)
	if b, err := os.ReadFile(filepath.Join(dir, nameFile)); err == nil && (name == "" || string(b) == name) {
		return id, nil
	}
	if b, err := os.ReadFile(filepath.Join(subBundleDir(dir, name), nameFile)); err == nil && string(b) == name {
		return subID(id, name), nil
	}
	return "", fmt.Errorf("sandbox %s has no container %q", id, name)
}

func lastBytes(b []byte, limit int) string {
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return strings.TrimSpace(string(b))
}
