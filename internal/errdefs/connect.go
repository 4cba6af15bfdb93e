package errdefs

import (
	"context"
	"errors"

	"connectrpc.com/connect"
)

// codes maps the kinds to status codes, in the order they are tested.
var codes = []struct {
	kind error
	code connect.Code
}{
	{ErrInvalidArgument, connect.CodeInvalidArgument},
	// Before NotFound: data loss is often a missing object.
	{ErrDataLoss, connect.CodeDataLoss},
	{ErrNotFound, connect.CodeNotFound},
	{ErrAlreadyExists, connect.CodeAlreadyExists},
	{ErrAborted, connect.CodeAborted},
	{ErrFailedPrecondition, connect.CodeFailedPrecondition},
	{ErrResourceExhausted, connect.CodeResourceExhausted},
	{ErrUnavailable, connect.CodeUnavailable},
	{ErrUnauthenticated, connect.CodeUnauthenticated},
	{ErrPermissionDenied, connect.CodePermissionDenied},
	{ErrUnimplemented, connect.CodeUnimplemented},
	{context.Canceled, connect.CodeCanceled},
	{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
}

// Code is the status code err carries: its own when it is (or wraps) a
// status error, as an error from another API's call is; else its kind's;
// else CodeInternal, the callee's fault.
func Code(err error) connect.Code {
	if err == nil {
		return 0
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	for _, c := range codes {
		if errors.Is(err, c.kind) {
			return c.code
		}
	}
	return connect.CodeInternal
}

// ToConnect is err as an API answers it: with the status code a caller can
// act on (Code) and err's message. Errors that already carry a code keep
// it. It is the one mapping, applied where a call leaves the process.
func ToConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(Code(err), err)
}

// FromCode is an error of the kind code stands for, with message msg: a
// status read back (a recorded outcome) as the error it was. A code no
// kind stands for (internal, unknown) makes an error of no kind, which
// Code takes for CodeInternal.
func FromCode(code connect.Code, msg string) error {
	for _, c := range codes {
		if c.code == code {
			return New(c.kind, msg)
		}
	}
	return errors.New(msg)
}

// FromConnect is err, returned by another API's call, as an error of the
// kind its status code stands for, so the caller tests kinds rather than
// codes. err stays reachable in it (errors.As finds the status error, its
// details and its cause), so an edge that passes it on answers err's code
// and message; its message is the status's, without the code. An error
// carrying no status, or a code no kind stands for, is returned as it is.
func FromConnect(err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	msg := err.Error()
	if err == error(ce) {
		msg = ce.Message()
	}
	for _, c := range codes {
		if c.code == ce.Code() {
			return &kindError{kind: c.kind, err: &remoteError{err: err, msg: msg}}
		}
	}
	return err
}

// Answered reports whether err carries a status the called side sent
// (its own outcome: "did not pass within 3s", "worker busy"), as opposed
// to one the client made because the call got no answer (refused, reset,
// its own deadline). A kind alone does not tell them apart: a deadline the
// callee reports and one the caller ran out of are both
// context.DeadlineExceeded.
func Answered(err error) bool {
	var ce *connect.Error
	return errors.As(err, &ce) && connect.IsWireError(ce)
}

// remoteError is a status error with the message it carries.
type remoteError struct {
	err error
	msg string
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.err }
