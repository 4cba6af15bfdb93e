package workflow

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/exits"
)

// refusingAgent answers Terminate with its error.
type refusingAgent struct {
	NodeAgent
	err error
}

func (a refusingAgent) Terminate(context.Context, *connect.Request[torporv1.TerminateRequest]) (*connect.Response[torporv1.TerminateResponse], error) {
	return nil, a.err
}

type oneAgent struct{ agent NodeAgent }

func (o oneAgent) Agent(context.Context, string) (NodeAgent, error) { return o.agent, nil }

// TestNodeCallsAnswerKinds: the engine's node calls return errors of a
// kind, the node's status error (its code, message and details) still
// reachable for the server's edge.
func TestNodeCallsAnswerKinds(t *testing.T) {
	status := exits.Error(connect.CodeFailedPrecondition, "worker w1 hosts actor a2", &torporv1.WorkloadExited{Exit: &torporv1.ContainerExit{Container: "app", ExitCode: 3}})
	agent, err := nodeAgents{oneAgent{refusingAgent{err: status}}}.Agent(context.Background(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = agent.Terminate(context.Background(), connect.NewRequest(&torporv1.TerminateRequest{}))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("%v: want a failed precondition", err)
	}
	if errdefs.Code(err) != connect.CodeFailedPrecondition || err.Error() != "worker w1 hosts actor a2" {
		t.Errorf("%v (code %v): want the node's code and message", err, errdefs.Code(err))
	}
	if exits.Of(err).GetExit().GetExitCode() != 3 {
		t.Errorf("%v: the node's detail is lost", err)
	}
}
