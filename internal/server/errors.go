package server

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// apiError turns an internal error into a status code a user can act on.
// Errors that already carry a code keep it.
func apiError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	var fe *validate.FieldError
	switch {
	case errors.As(err, &ce):
		return err
	case errors.As(err, &fe), errors.Is(err, store.ErrInvalidArgument):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, store.ErrNotFound):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, store.ErrAlreadyExists):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, store.ErrConflict):
		return connect.NewError(connect.CodeAborted, err)
	case errors.Is(err, store.ErrUnavailable):
		// The store already rode out what it could of a database restart:
		// the caller may retry, as for a lost connection.
		return connect.NewError(connect.CodeUnavailable, err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

func failedPrecondition(format string, args ...any) error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, args...))
}

func invalidArgument(path, format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, &validate.FieldError{Path: path, Reason: fmt.Sprintf(format, args...)})
}
