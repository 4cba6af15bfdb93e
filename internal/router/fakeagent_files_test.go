package router

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// The router serves no file calls; the fake agent has none.
var errNoFiles = connect.NewError(connect.CodeUnimplemented, errors.New("the fake agent has no file calls"))

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
