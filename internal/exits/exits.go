// Package exits describes how a workload's container ended on its own
// (torporv1.ContainerExit): made from the status a runtime reports, in
// the words every part uses (the node's errors, the actor's events, the
// router's answers), and carried from one process to the next as the
// detail of a status error (torporv1.WorkloadExited).
package exits

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// signalBase: runtimes report a process killed by signal N as status
// 128+N, as shells do.
const signalBase = 128

// New is container's exit with status (128+N for signal N) at time at,
// with its last lines of output.
func New(container string, status int, lastOutput []string, at time.Time) *torporv1.ContainerExit {
	e := &torporv1.ContainerExit{Container: container, ExitCode: int32(status), LastOutput: lastOutput, Time: timestamppb.New(at)}
	if sig := unix.Signal(status - signalBase); status > signalBase && unix.SignalName(sig) != "" {
		e.Signal = unix.SignalName(sig)
	}
	return e
}

// Unknown is an exit of container whose status could not be read.
func Unknown(container string, lastOutput []string, at time.Time) *torporv1.ContainerExit {
	return &torporv1.ContainerExit{Container: container, StatusUnknown: true, LastOutput: lastOutput, Time: timestamppb.New(at)}
}

// Failed says whether the exit is a failure: a status other than 0, a
// kill, or a status nobody could read.
func Failed(e *torporv1.ContainerExit) bool {
	return e.GetExitCode() != 0 || e.GetSignal() != "" || e.GetStatusUnknown()
}

// Status is how the container ended, without its output:
// "container app exited with status 1", "container app was killed by
// SIGKILL (status 137)".
func Status(e *torporv1.ContainerExit) string {
	switch {
	case e.GetStatusUnknown():
		return fmt.Sprintf("container %s exited (its status is unknown: the sandbox ended before it could be read)", e.GetContainer())
	case e.GetSignal() != "":
		return fmt.Sprintf("container %s was killed by %s (status %d)", e.GetContainer(), e.GetSignal(), e.GetExitCode())
	}
	return fmt.Sprintf("container %s exited with status %d", e.GetContainer(), e.GetExitCode())
}

// Describe is Status followed by the container's last lines of output:
// "container app exited with status 3: bye".
func Describe(e *torporv1.ContainerExit) string {
	if len(e.GetLastOutput()) == 0 {
		return Status(e) + " (no output)"
	}
	return Status(e) + ": " + strings.Join(e.GetLastOutput(), " | ")
}

// Error is a status error of code with message msg, carrying detail so
// the next process reads the exit back (Of).
func Error(code connect.Code, msg string, detail *torporv1.WorkloadExited) error {
	err := connect.NewError(code, errors.New(msg))
	if d, derr := connect.NewErrorDetail(detail); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// Of is the exit err carries as its detail (Error), or nil.
func Of(err error) *torporv1.WorkloadExited {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if w, ok := v.(*torporv1.WorkloadExited); ok {
				return w
			}
		}
	}
	return nil
}
