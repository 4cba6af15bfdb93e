package router

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// The router serves no data-plane calls (files, exec, logs); the fake
// agent has none.
var errNoFiles = connect.NewError(connect.CodeUnimplemented, errors.New("the fake agent has no data-plane calls"))

func (f *fakeAgent) StatFile(context.Context, *connect.Request[torporv1.NodeFileRequest]) (*connect.Response[torporv1.FileInfo], error) {
	return nil, errNoFiles
}

func (f *fakeAgent) ListFiles(context.Context, *connect.Request[torporv1.NodeFileRequest]) (*connect.Response[torporv1.ListActorFilesResponse], error) {
	return nil, errNoFiles
}

func (f *fakeAgent) ReadFiles(context.Context, *connect.Request[torporv1.NodeReadFilesRequest], *connect.ServerStream[torporv1.FileChunk]) error {
	return errNoFiles
}

func (f *fakeAgent) WriteFiles(context.Context, *connect.ClientStream[torporv1.NodeWriteFilesRequest]) (*connect.Response[torporv1.WriteActorFilesResponse], error) {
	return nil, errNoFiles
}

func (f *fakeAgent) Exec(context.Context, *connect.BidiStream[torporv1.ExecRequest, torporv1.ExecOutput]) error {
	return errNoFiles
}

func (f *fakeAgent) Logs(context.Context, *connect.Request[torporv1.LogsRequest], *connect.ServerStream[torporv1.GetActorLogsResponse]) error {
	return errNoFiles
}
