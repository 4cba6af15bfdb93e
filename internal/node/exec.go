package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/runtime"
)

// execStream is an exec's two ways: the process's start and input in,
// its output and exit out (a connect.BidiStream).
type execStream interface {
	Receive() (*torporv1.ExecRequest, error)
	Send(*torporv1.ExecOutput) error
}

// exec runs a process in the worker's running workload, streaming its
// input and output; the last message carries its exit status.
func (d *dataPlane) exec(ctx context.Context, stream execStream) error {
	first, err := stream.Receive()
	if err != nil {
		return err
	}
	s, err := d.slots.slot(first.GetWorker())
	if err != nil {
		return err
	}
	if err := hosts(s, s.current(), first.GetActorUid()); err != nil {
		return err
	}
	p := first.GetProcess()
	if len(p.GetCommand()) == 0 {
		return invalid("process.command", "required")
	}
	input, resize := d.receiveInput(stream)
	defer input.Close()
	out := &execSender{stream: stream}
	spec := runtime.ExecSpec{
		Container: p.GetContainer(), Command: p.GetCommand(), TTY: p.GetTty(), Size: terminalSize(p.GetSize()),
		Stdout: out.writer(func(b []byte) *torporv1.ExecOutput { return &torporv1.ExecOutput{Stdout: b} }),
		Stderr: out.writer(func(b []byte) *torporv1.ExecOutput { return &torporv1.ExecOutput{Stderr: b} }),
		Resize: resize,
	}
	if p.GetStdin() {
		spec.Stdin = input
	}
	d.log.Debug("exec", "worker", s.name(), "actor_uid", first.GetActorUid(), "container", p.GetContainer(), "command", p.GetCommand(), "tty", p.GetTty())
	ctx, stop := untilDraining(ctx)
	defer stop()
	code, err := d.rt.ExecStream(ctx, s.rt, spec)
	if cause := context.Cause(ctx); errors.Is(cause, errAgentStopping) {
		return errdefs.Errorf(errdefs.ErrUnavailable, "worker %s: exec in actor %s: %w", s.name(), first.GetActorUid(), cause)
	}
	if err != nil {
		return fmt.Errorf("worker %s: actor %s: %w", s.name(), first.GetActorUid(), err)
	}
	return out.send(&torporv1.ExecOutput{Exit: &torporv1.ExecExit{Code: int32(code)}})
}

// receiveInput feeds the stream's further messages to a process: its
// input (ending at close_stdin or the stream's end) and its terminal's
// sizes. Closing the reader ends the feeding; the feeding itself ends
// with the stream, which may outlast the call (pumps).
func (d *dataPlane) receiveInput(stream execStream) (io.ReadCloser, <-chan runtime.TerminalSize) {
	r, w := io.Pipe()
	resize := make(chan runtime.TerminalSize, 1)
	d.pumps.Go(func() {
		defer w.Close()
		for {
			req, err := stream.Receive()
			if err != nil {
				return
			}
			in := req.GetInput()
			if len(in.GetStdin()) > 0 {
				// Fails once the process ended; the stream is still read
				// to its end.
				w.Write(in.GetStdin())
			}
			if in.GetResize() != nil {
				// Only the latest size matters.
				select {
				case <-resize:
				default:
				}
				resize <- terminalSize(in.GetResize())
			}
			if in.GetCloseStdin() {
				w.Close()
			}
		}
	})
	return r, resize
}

func terminalSize(s *torporv1.TerminalSize) runtime.TerminalSize {
	return runtime.TerminalSize{Rows: uint16(min(s.GetRows(), 0xffff)), Cols: uint16(min(s.GetCols(), 0xffff))}
}

// execSender sends a process's output from its two streams' writers, one
// message at a time.
type execSender struct {
	mu     sync.Mutex
	stream execStream
}

func (e *execSender) send(msg *torporv1.ExecOutput) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stream.Send(msg)
}

func (e *execSender) writer(wrap func([]byte) *torporv1.ExecOutput) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		if err := e.send(wrap(append([]byte(nil), b...))); err != nil {
			return 0, err
		}
		return len(b), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
