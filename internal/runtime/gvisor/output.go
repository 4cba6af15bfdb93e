package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/runtime"
)

// detachedFor runs a runsc command that starts (or makes) container i of
// the sandbox whose bundle is dir: the container's standard streams are
// the command's, so they go to the slot's output FIFOs when it has them,
// and runsc's own errors then to the bundle's console.log (--log), where
// an error is read from.
func (r *Runtime) detachedFor(ctx context.Context, slot runtime.Slot, i int, dir string, args ...string) error {
	logPath := filepath.Join(dir, "console.log")
	args = append(sandboxLogFlags(dir), args...)
	if slot.Output == "" {
		return r.detached(ctx, logPath, args...)
	}
	stdout, err := openOutput(runtime.OutputPath(slot.Output, i, "out"))
	if err != nil {
		return err
	}
	defer stdout.Close()
	stderr, err := openOutput(runtime.OutputPath(slot.Output, i, "err"))
	if err != nil {
		return err
	}
	defer stderr.Close()
	cmd := r.command(ctx, append([]string{"--log=" + logPath}, args...)...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s: %w: %s", subcommand(args), err, tail(logPath, 0, 2048))
	}
	return nil
}

// openOutput opens the FIFO at path (made if missing) for writing. It is
// opened for reading too, so it always has a reader: a write never fails
// while the node's reader is away (a restart), and blocks only once the
// pipe's buffer is full.
func openOutput(path string) (*os.File, error) {
	if err := unix.Mkfifo(path, 0o600); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("output FIFO %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("output FIFO %s: %w", path, err)
	}
	return f, nil
}
