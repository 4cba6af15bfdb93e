package gvisor

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor/internal/runtime"
	"golang.org/x/sys/unix"
)

// Exits. `runsc wait` reports a container's exit status only to a waiter
// connected when it exits: the sandbox of the first container ends with
// it, and its status with it. A container that exits before the waiter
// connects (a command that fails at once) would leave no status, so each
// sandbox logs its own end (runsc's boot debug log, sandboxLog, Info
// level only: its start and its end, and a capture's steps), read when
// the waiter came too late.

// sandboxLog is where, in a sandbox's bundle, the sandbox's own runsc
// log goes (--debug-log of the boot command only).
const sandboxLog = "sandbox.log"

// sandboxLogFlags are the runsc flags that give a sandbox started from
// the bundle at dir its log.
func sandboxLogFlags(dir string) []string {
	return []string{"--debug-log=" + filepath.Join(dir, sandboxLog), "--debug-command=boot"}
}

// WaitExit waits until a container of the slot's running workload exits
// and says which and how: the sandbox's first container ends the
// sandbox, any other only itself. ErrNotRunning if the slot runs none; an
// error when ctx ends first.
func (r *Runtime) WaitExit(ctx context.Context, slot runtime.Slot) (runtime.Exit, error) {
	unlock := r.lock(slot.Name)
	active, _, err := r.sandboxes(slot.Name)
	unlock()
	if err != nil {
		return runtime.Exit{}, err
	}
	if len(active) != 1 {
		return runtime.Exit{}, fmt.Errorf("slot %s: wait: %w (%d sandboxes)", slot.Name, runtime.ErrNotRunning, len(active))
	}
	id := active[0]
	dir := r.bundleDir(slot.Name, id)
	first, err := os.ReadFile(filepath.Join(dir, nameFile))
	if err != nil {
		return runtime.Exit{}, fmt.Errorf("slot %s: wait: %w", slot.Name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type waited struct {
		exit runtime.Exit
		err  error
	}
	// The first container's waiter always answers; another's fails once
	// the sandbox is gone, and only its success is news.
	root := make(chan waited, 1)
	others := make(chan runtime.Exit, 1)
	go func() {
		exit, err := r.waitContainer(ctx, id, id, string(first))
		if err != nil && ctx.Err() == nil {
			exit, err = r.sandboxEnd(dir, string(first)), nil
		}
		root <- waited{exit, err}
	}()
	subs, _ := filepath.Glob(filepath.Join(dir, "containers", "*"))
	for _, sub := range subs {
		name := filepath.Base(sub)
		go func() {
			if exit, err := r.waitContainer(ctx, id, subID(id, name), name); err == nil {
				select {
				case others <- exit:
				default:
				}
			}
		}()
	}
	select {
	case w := <-root:
		return w.exit, w.err
	case exit := <-others:
		return exit, nil
	}
}

// waitContainer waits for container id (named name) of sandbox
// sandboxID to exit, as `runsc wait` does, through the sandbox's control
// server (control.go).
func (r *Runtime) waitContainer(ctx context.Context, sandboxID, id, name string) (runtime.Exit, error) {
	var status uint32
	if err := r.controlCall(ctx, sandboxID, "containerManager.Wait", id, &status); err != nil {
		return runtime.Exit{}, fmt.Errorf("wait for container %s: %w", id, err)
	}
	ws := unix.WaitStatus(status)
	exit := runtime.Exit{Container: name, Status: ws.ExitStatus(), Known: true}
	if ws.Signaled() {
		exit.Status = 128 + int(ws.Signal())
	}
	return exit, nil
}

// sandboxEndLine is the sandbox log's last word on its first container.
var sandboxEndLine = regexp.MustCompile(`application exiting with (?:exit status (\d+)|killed by signal (\d+))`)

// sandboxEnd is the exit of the first container (named name) of the
// sandbox whose bundle is dir, as its log tells; unknown if it does not.
func (r *Runtime) sandboxEnd(dir, name string) runtime.Exit {
	exit := runtime.Exit{Container: name}
	f, err := os.Open(filepath.Join(dir, sandboxLog))
	if err != nil {
		return exit
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		m := sandboxEndLine.FindStringSubmatch(s.Text())
		switch {
		case m == nil:
		case m[1] != "":
			exit.Status, _ = strconv.Atoi(m[1])
			exit.Known = true
		default:
			sig, _ := strconv.Atoi(m[2])
			exit.Status, exit.Known = 128+sig, true
		}
	}
	return exit
}

// subcommand is the runsc command args run: the first that is no flag.
func subcommand(args []string) string {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return ""
}
