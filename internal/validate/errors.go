// Package validate checks API records before anything is written. Every
// failure is a FieldError naming the offending field by its JSON path (e.g.
// "spec.containers[0].image"), so the API can answer InvalidArgument and the
// CLI can point at the line of a YAML file.
package validate

import "fmt"

// FieldError says which field is wrong and why.
type FieldError struct {
	// Path in protobuf JSON names: "spec.volumes[1].name".
	Path   string
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Path, e.Reason) }

func fieldErr(path, format string, args ...any) *FieldError {
	return &FieldError{Path: path, Reason: fmt.Sprintf(format, args...)}
}
