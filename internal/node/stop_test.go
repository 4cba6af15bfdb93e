package node

import (
	"context"
	"testing"

	"go.uber.org/goleak"
)

// TestStopLeavesNoGoroutine: the agent's stop waits for every goroutine
// it started (its loops, its operations, its watches, the streams'
// pumps), even with a workload left running for the next agent.
func TestStopLeavesNoGoroutine(t *testing.T) {
	n := newFakeNode(t)
	// The control plane's goroutines (its server, its store) and the
	// test's own are not the agent's.
	if err := n.stop(); err != nil {
		t.Fatalf("agent stopped with %v", err)
	}
	before := goleak.IgnoreCurrent()
	n.start(t)
	if _, err := n.run(context.Background(), "a1", "op-1", 0); err != nil {
		t.Fatal(err)
	}
	if err := n.stop(); err != nil {
		t.Fatalf("agent stopped with %v", err)
	}
	goleak.VerifyNone(t, before)
}
