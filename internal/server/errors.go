package server

import (
	"fmt"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor/internal/validate"
)

func failedPrecondition(format string, args ...any) error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, args...))
}

func invalidArgument(path, format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, &validate.FieldError{Path: path, Reason: fmt.Sprintf(format, args...)})
}
