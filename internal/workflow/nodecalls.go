package workflow

import (
	"context"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// nodeAgents is the engine's boundary with the node agents: the status
// errors a node call returns come back as errors of a kind
// (errdefs.FromConnect), so the steps test kinds, not status codes. The
// status error stays reachable in them, so the server's edge answers a
// node's code and message as before.
type nodeAgents struct{ agents Agents }

func (n nodeAgents) Agent(ctx context.Context, node string) (NodeAgent, error) {
	a, err := n.agents.Agent(ctx, node)
	if err != nil {
		return nil, err
	}
	if _, ok := a.(warmRequester); ok {
		return warmingCalls{nodeCalls{a}}, nil
	}
	return nodeCalls{a}, nil
}

// nodeCalls are one node's calls, their errors of a kind.
type nodeCalls struct{ agent NodeAgent }

// answered is a node call's answer, its error of a kind.
func answered[T any](resp *connect.Response[T], err error) (*connect.Response[T], error) {
	return resp, errdefs.FromConnect(err)
}

func (c nodeCalls) Run(ctx context.Context, req *connect.Request[torporv1.RunRequest]) (*connect.Response[torporv1.RunResponse], error) {
	return answered(c.agent.Run(ctx, req))
}

func (c nodeCalls) Checkpoint(ctx context.Context, req *connect.Request[torporv1.CheckpointRequest]) (*connect.Response[torporv1.CheckpointResponse], error) {
	return answered(c.agent.Checkpoint(ctx, req))
}

func (c nodeCalls) Restore(ctx context.Context, req *connect.Request[torporv1.RestoreRequest]) (*connect.Response[torporv1.RestoreResponse], error) {
	return answered(c.agent.Restore(ctx, req))
}

func (c nodeCalls) Terminate(ctx context.Context, req *connect.Request[torporv1.TerminateRequest]) (*connect.Response[torporv1.TerminateResponse], error) {
	return answered(c.agent.Terminate(ctx, req))
}

func (c nodeCalls) Stats(ctx context.Context, req *connect.Request[torporv1.StatsRequest]) (*connect.Response[torporv1.StatsResponse], error) {
	return answered(c.agent.Stats(ctx, req))
}

func (c nodeCalls) DropCheckpoint(ctx context.Context, req *connect.Request[torporv1.DropCheckpointRequest]) (*connect.Response[torporv1.DropCheckpointResponse], error) {
	return answered(c.agent.DropCheckpoint(ctx, req))
}

// warmingCalls are the calls of a node that warms workers (warmRequester).
type warmingCalls struct{ nodeCalls }

func (c warmingCalls) Warm(ctx context.Context, req *connect.Request[torporv1.WarmRequest]) (*connect.Response[torporv1.WarmResponse], error) {
	return answered(c.agent.(warmRequester).Warm(ctx, req))
}
