package fake

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor/internal/runtime"
)

// ExecStream implements runtime.Runtime with a few commands of its own:
// echo ARGS, cat (its input back), true, false, exit N, and sh, which
// runs each line of its input as one of these (exit ends it). Anything
// else exits 127. On a terminal the output of sh's commands ends lines
// with CRLF, as a terminal's does, and its input is not echoed.
func (f *Runtime) ExecStream(ctx context.Context, slot runtime.Slot, p runtime.ExecSpec) (int, error) {
	if err := f.enter(ctx, Call{Method: "ExecStream", Slot: slot.Name, Container: p.Container, Cmd: slices.Clone(p.Command)}); err != nil {
		return 0, err
	}
	if len(p.Command) == 0 {
		return 0, fmt.Errorf("slot %s: exec in container %q: no command given", slot.Name, p.Container)
	}
	if err := f.execTarget(slot, p.Container); err != nil {
		return 0, fmt.Errorf("slot %s: exec %q: %w", slot.Name, p.Command, err)
	}
	stdin := p.Stdin
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	stderr := p.Stderr
	if p.TTY {
		stderr = p.Stdout
	}
	code, _ := fakeCommand(p.Command, stdin, p.Stdout, stderr, p.TTY)
	return code, nil
}

// execTarget checks that slot runs a workload with the container
// (empty: any).
func (f *Runtime) execTarget(slot runtime.Slot, container string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[slot.Name]
	if !ok || sb.crashed {
		return runtime.ErrNotRunning
	}
	if _, ok := sb.spec[container]; container != "" && !ok {
		return fmt.Errorf("the workload has no container %q", container)
	}
	return nil
}

// fakeCommand runs cmd; exited says whether it was an exit.
func fakeCommand(cmd []string, stdin io.Reader, stdout, stderr io.Writer, tty bool) (code int, exited bool) {
	switch cmd[0] {
	case "echo":
		fmt.Fprintln(stdout, strings.Join(cmd[1:], " "))
	case "cat":
		io.Copy(stdout, stdin)
	case "true":
	case "false":
		return 1, false
	case "exit":
		if len(cmd) > 1 {
			code, _ = strconv.Atoi(cmd[1])
		}
		return code, true
	case "sh":
		lines := bufio.NewScanner(stdin)
		for lines.Scan() {
			fields := strings.Fields(lines.Text())
			if len(fields) == 0 {
				continue
			}
			out := stdout
			if tty {
				out = crlf{stdout}
			}
			if code, exited = fakeCommand(fields, strings.NewReader(""), out, out, tty); exited {
				return code, false
			}
		}
	default:
		fmt.Fprintf(stderr, "%s: not found\n", cmd[0])
		return 127, false
	}
	return 0, false
}

// crlf writes lines ending in CRLF, as a terminal's output does.
type crlf struct{ w io.Writer }

func (c crlf) Write(b []byte) (int, error) {
	if _, err := c.w.Write([]byte(strings.ReplaceAll(string(b), "\n", "\r\n"))); err != nil {
		return 0, err
	}
	return len(b), nil
}
