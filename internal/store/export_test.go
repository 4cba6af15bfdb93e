package store

import (
	"testing"
	"time"
)

// SetRetryBudget shortens how long store calls ride out transient errors
// until tb ends, so a test of an outage longer than the budget does not
// wait the production budget out. Tests using it must not run in parallel.
func SetRetryBudget(tb testing.TB, budget time.Duration) {
	old := transientRetry
	transientRetry.Budget = budget
	tb.Cleanup(func() { transientRetry = old })
}
