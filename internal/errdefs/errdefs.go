// Package errdefs holds the errors that cross package boundaries by
// meaning rather than by type: the store, the workflow engine, snapshots and
// runtimes return errors of these kinds, their consumers test for them
// without importing the package that made them (identity tests for
// ErrNotFound, and so links into the CLI without the SQL drivers), and each
// API's edge turns them into status codes once (ToConnect).
package errdefs

import (
	"errors"
	"fmt"
)

// The kinds. Errors carrying one name the object (fmt.Errorf with %w, or
// Errorf).
var (
	// ErrNotFound: the named record, secret or object does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: the name is taken.
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalidArgument: a request the callee cannot accept as written,
	// whatever the state.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrFailedPrecondition: the request is refused in the current state;
	// the caller must change the state first.
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrAborted: a concurrent change won; the caller may retry at once.
	ErrAborted = errors.New("aborted")
	// ErrResourceExhausted: no capacity now; the caller may retry later.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrUnavailable: a dependency is out of reach for now; retrying may
	// succeed.
	ErrUnavailable = errors.New("unavailable")
	// ErrDataLoss: stored data is missing or corrupt.
	ErrDataLoss = errors.New("data loss")
	// ErrUnauthenticated: the caller did not say who it is.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: the caller, or the process acting for it, may
	// not do this.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnimplemented: the callee does not offer the operation (an older
	// version of it).
	ErrUnimplemented = errors.New("unimplemented")
)

// Errorf is an error with the formatted message, of the given kind:
// errors.Is(err, kind) holds, and what the format wraps with %w stays
// reachable.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

// New is a sentinel error of the given kind with its own message, for a
// package that tells its errors apart more finely than the kinds do.
func New(kind error, msg string) error {
	return &kindError{kind: kind, err: errors.New(msg)}
}

type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string { return e.err.Error() }

func (e *kindError) Unwrap() []error { return []error{e.err, e.kind} }
