package gateproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// spawn starts the gate process for stateDir on listen, detached: a
// session of its own, no descriptor of the agent's (a closed pipe or the
// agent's terminal going away must not end it), its output appended to
// the log file in the state directory.
func spawn(command []string, stateDir, listen string) (*os.Process, error) {
	if len(command) == 0 {
		return nil, errors.New("slot gate: no command to start it with")
	}
	logPath := filepath.Join(stateDir, logFile)
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("slot gate: log: %w", err)
	}
	defer out.Close() // the child has its own descriptor
	args := append(append([]string(nil), command[1:]...), "--state-dir", stateDir, "--listen", listen)
	cmd := exec.Command(command[0], args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("slot gate: start %s: %w", command[0], err)
	}
	return cmd.Process, nil
}

// running is the pid of the gate process of stateDir from its pid file,
// if that process still runs and is that gate (not a process that got
// the number of a dead one).
func running(stateDir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(stateDir, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !alive(pid) {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(stateDir)) {
		return 0, false
	}
	return pid, true
}

// alive says whether pid runs: a zombie does not.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may hold
	// anything.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || (stat[i+2] != 'Z' && stat[i+2] != 'X')
}

// gone waits until pid no longer runs, reaping it when it is this
// process's child (proc), for at most wait.
func gone(pid int, proc *os.Process, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for alive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("slot gate process %d still runs %s after it was told to stop", pid, wait)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if proc != nil {
		_, _ = proc.Wait()
	}
	return nil
}

// kill ends the gate process pid at once (SIGKILL), with every connection
// it spliced, and returns once it is gone.
func kill(pid int, proc *os.Process) error {
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("slot gate process %d: kill: %w", pid, err)
	}
	return gone(pid, proc, 10*time.Second)
}

// StopLeftover stops the gate process a stopped node agent left running
// on stateDir (SIGTERM, then SIGKILL after a few seconds), for `torpor
// node --cleanup`; it returns its pid, 0 if none ran.
func StopLeftover(ctx context.Context, stateDir string) (int, error) {
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return 0, fmt.Errorf("slot gate: %w", err)
	}
	pid, ok := running(stateDir)
	if !ok {
		return 0, nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return pid, fmt.Errorf("slot gate process %d: %w", pid, err)
	}
	wait := 5 * time.Second
	if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
		wait = time.Until(d)
	}
	if gone(pid, nil, wait) == nil {
		return pid, nil
	}
	return pid, kill(pid, nil)
}
