package cli

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// ReportActivity is for routers; no command calls it.
func (f *fakeAPI) ReportActivity(context.Context, *connect.Request[torporv1.ReportActivityRequest]) (*connect.Response[torporv1.ReportActivityResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("no command reports activity"))
}
