package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"
)

func TestToConnect(t *testing.T) {
	sentinel := New(ErrAborted, "version conflict")
	tests := []struct {
		name string
		err  error
		code connect.Code
		msg  string
	}{
		{"not found", fmt.Errorf("actor a/b: %w", ErrNotFound), connect.CodeNotFound, "actor a/b: not found"},
		{"already exists", fmt.Errorf("space x: %w", ErrAlreadyExists), connect.CodeAlreadyExists, "space x: already exists"},
		{"invalid", Errorf(ErrInvalidArgument, "bad %s", "name"), connect.CodeInvalidArgument, "bad name"},
		{"precondition", Errorf(ErrFailedPrecondition, "actor is %s", "RUNNING"), connect.CodeFailedPrecondition, "actor is RUNNING"},
		{"sentinel of a kind", fmt.Errorf("actor a/b: %w", sentinel), connect.CodeAborted, "actor a/b: version conflict"},
		{"exhausted", Errorf(ErrResourceExhausted, "no free worker"), connect.CodeResourceExhausted, "no free worker"},
		{"unavailable", Errorf(ErrUnavailable, "store down"), connect.CodeUnavailable, "store down"},
		{"data loss over not found", Errorf(ErrDataLoss, "object: %w", ErrNotFound), connect.CodeDataLoss, "object: not found"},
		{"canceled", fmt.Errorf("list: %w", context.Canceled), connect.CodeCanceled, "list: context canceled"},
		{"deadline", fmt.Errorf("list: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded, "list: context deadline exceeded"},
		{"anything else", errors.New("disk on fire"), connect.CodeInternal, "disk on fire"},
		{"a status error keeps its code", fmt.Errorf("node n1: %w", connect.NewError(connect.CodeUnavailable, ErrNotFound)), connect.CodeUnavailable, "not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Code(tt.err); got != tt.code {
				t.Errorf("Code = %v, want %v", got, tt.code)
			}
			ce := new(connect.Error)
			if !errors.As(ToConnect(tt.err), &ce) || ce.Code() != tt.code || ce.Message() != tt.msg {
				t.Errorf("ToConnect = %v; want code %v, message %q", ToConnect(tt.err), tt.code, tt.msg)
			}
		})
	}
	if ToConnect(nil) != nil || Code(nil) != 0 {
		t.Error("nil is no error")
	}
}

func TestKindErrorKeepsWhatItWraps(t *testing.T) {
	err := Errorf(ErrFailedPrecondition, "step: %w", context.Canceled)
	if !errors.Is(err, ErrFailedPrecondition) || !errors.Is(err, context.Canceled) {
		t.Errorf("%v: want it both of its kind and the error it wraps", err)
	}
	if errors.Is(err, ErrNotFound) {
		t.Errorf("%v is not ErrNotFound", err)
	}
}

func TestFromConnect(t *testing.T) {
	tests := []struct {
		code connect.Code
		kind error
	}{
		{connect.CodeNotFound, ErrNotFound},
		{connect.CodeFailedPrecondition, ErrFailedPrecondition},
		{connect.CodePermissionDenied, ErrPermissionDenied},
		{connect.CodeUnauthenticated, ErrUnauthenticated},
		{connect.CodeUnimplemented, ErrUnimplemented},
		{connect.CodeUnavailable, ErrUnavailable},
		{connect.CodeDataLoss, ErrDataLoss},
		{connect.CodeDeadlineExceeded, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			status := connect.NewError(tt.code, errors.New("worker w1 is busy"))
			err := FromConnect(status)
			if !errors.Is(err, tt.kind) {
				t.Errorf("%v: want it of kind %v", err, tt.kind)
			}
			if ce := new(connect.Error); !errors.As(err, &ce) || ce != status {
				t.Errorf("%v: the status error is not reachable in it", err)
			}
			if Code(err) != tt.code || ToConnect(err) != err {
				t.Errorf("Code = %v, want %v; ToConnect must pass it on", Code(err), tt.code)
			}
			if err.Error() != "worker w1 is busy" {
				t.Errorf("message %q, want the status's", err)
			}
			if got := FromCode(tt.code, "m"); Code(got) != tt.code || got.Error() != "m" {
				t.Errorf("FromCode = %v (code %v), want code %v, message m", got, Code(got), tt.code)
			}
		})
	}
	wrapped := fmt.Errorf("node n1: %w", connect.NewError(connect.CodeNotFound, errors.New("no worker")))
	if err := FromConnect(wrapped); !errors.Is(err, ErrNotFound) || err.Error() != wrapped.Error() {
		t.Errorf("FromConnect(%v) = %v: want a not found keeping the wrapped message", wrapped, err)
	}
	internal := connect.NewError(connect.CodeInternal, errors.New("boom"))
	plain := errors.New("dial: refused")
	if FromConnect(internal) != internal || FromConnect(plain) != plain || FromConnect(nil) != nil {
		t.Error("an error without a status, or with a code of no kind, is returned as it is")
	}
	if got := FromCode(connect.CodeInternal, "boom"); Code(got) != connect.CodeInternal {
		t.Errorf("FromCode(internal) has code %v", Code(got))
	}
}
