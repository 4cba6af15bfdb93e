package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"connectrpc.com/connect"
)

// TestUnavailable: what the router asks the control plane again for.
func TestUnavailable(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	brokenPipe := &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"unavailable", connect.NewError(connect.CodeUnavailable, errors.New("store unavailable")), true},
		{"connection reset by a killed control plane", connect.NewError(connect.CodeCanceled, fmt.Errorf("get: %w", reset)), true},
		{"request written to a killed control plane", connect.NewError(connect.CodeCanceled, fmt.Errorf("post: %w", brokenPipe)), true},
		{"response cut short", connect.NewError(connect.CodeUnknown, io.ErrUnexpectedEOF), true},
		{"the request's client left", connect.NewError(connect.CodeCanceled, context.Canceled), false},
		{"an answer", connect.NewError(connect.CodeNotFound, errors.New("no actor")), false},
		{"no error", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := unavailable(tt.err); got != tt.want {
				t.Fatalf("unavailable(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
