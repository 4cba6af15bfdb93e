package node

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// Logs streams the actor's log on this node.
func (m *slotMachine) Logs(ctx context.Context, req *connect.Request[torporv1.LogsRequest], stream *connect.ServerStream[torporv1.GetActorLogsResponse]) error {
	return connect.NewError(connect.CodeUnimplemented, errors.New("logs are not kept yet"))
}
