// Package validate checks API records before anything is written. Every
// failure is a FieldError naming the offending field by its JSON path (e.g.
// "spec.containers[0].image"), so the API can answer InvalidArgument and the
// CLI can point at the line of a YAML file.
package validate

import (
	"fmt"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// FieldError says which field is wrong and why.
type FieldError struct {
	// Path in protobuf JSON names: "spec.volumes[1].name".
	Path   string
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Path, e.Reason) }

// Is makes every field error an errdefs.ErrInvalidArgument.
func (e *FieldError) Is(target error) bool { return target == errdefs.ErrInvalidArgument }

func fieldErr(path, format string, args ...any) *FieldError {
	return &FieldError{Path: path, Reason: fmt.Sprintf(format, args...)}
}
