package workflow

import (
	"testing"

	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// TestWorkflowsOnPostgres runs the tests that pin the invariants of resume
// and suspend over PostgreSQL, whose store defers and pipelines statements
// (pgpipeline.go) and whose transactions interleave unlike SQLite's single
// writer: a claim that lost its race, a finalize over a concurrent write
// or a recorded crash must end exactly as on SQLite.
func TestWorkflowsOnPostgres(t *testing.T) {
	tests := []struct {
		name string
		run  func(*testing.T)
	}{
		{"ResumeSuspendCycle", TestResumeSuspendCycle},
		{"CrashDuringResumeIsNotOverwritten", TestCrashDuringResumeIsNotOverwritten},
		{"CrashDuringSuspendIsNotOverwritten", TestCrashDuringSuspendIsNotOverwritten},
		{"ResumeFinalizesOverAnUnrelatedWrite", TestResumeFinalizesOverAnUnrelatedWrite},
		{"SuspendFinalizesOverAnUnrelatedWrite", TestSuspendFinalizesOverAnUnrelatedWrite},
		{"RecoverFinishesStepsInFlight", TestRecoverFinishesStepsInFlight},
		{"ConcurrentResumesRunOnce", TestConcurrentResumesRunOnce},
		{"ConcurrentResumesClaimDifferentWorkers", TestConcurrentResumesClaimDifferentWorkers},
		{"ConcurrentResumesEvictExactlyN", TestConcurrentResumesEvictExactlyN},
		{"EvictedWorkerIsReservedForTheEvictingResume", TestEvictedWorkerIsReservedForTheEvictingResume},
		{"IdleStopCancelledByRequestAfterClaim", TestIdleStopCancelledByRequestAfterClaim},
		{"RepointRacingResume", TestRepointRacingResume},
		{"RetentionKeepsLastK", TestRetentionKeepsLastK},
		{"PauseResumesOnSameNode", TestPauseResumesOnSameNode},
		{"FailedResumeKeepsTheNewestState", TestFailedResumeKeepsTheNewestState},
		{"EveryDeletionPathKeepsReferencedSnapshots", TestEveryDeletionPathKeepsReferencedSnapshots},
		{"DeleteSnapshotRefusesHeldSnapshots", TestDeleteSnapshotRefusesHeldSnapshots},
	}
	// The workflow tests do not run in parallel: newEnv's store can be
	// switched for the duration of these.
	defer func(sqlite func(*testing.T) string) { envStoreURL = sqlite }(envStoreURL)
	envStoreURL = func(t *testing.T) string { return storetest.URL(t, "postgres") }
	for _, tt := range tests {
		t.Run(tt.name, tt.run)
	}
}
