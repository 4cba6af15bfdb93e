// Package errdefs holds the errors that cross package boundaries by
// meaning rather than by type: the store returns them and its consumers
// test for them without importing the store (identity does, and so links
// into the CLI without the SQL drivers).
package errdefs

import "errors"

// ErrNotFound: the named record or secret does not exist. Errors carrying
// it name the object (fmt.Errorf with %w).
var ErrNotFound = errors.New("not found")
