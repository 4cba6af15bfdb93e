package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The runsc command: every call to it goes through here, with the
// runtime's global flags, a timeout, and its errors carrying runsc's own
// output; and what it reports of its containers (state, events).

// socket is the control socket runsc makes for sandbox id.
func (r *Runtime) socket(id string) string {
	return filepath.Join(r.runscDir, "runsc-"+id+".sock")
}

// stateFile is where runsc records container id of sandbox sandboxID.
func (r *Runtime) stateFile(id, sandboxID string) string {
	return filepath.Join(r.runscDir, id+"_sandbox:"+sandboxID+".state")
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

// containers lists the container ids runsc knows.
func (r *Runtime) containers(ctx context.Context) ([]string, error) {
	out, err := r.output(ctx, "list", "--quiet")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
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
