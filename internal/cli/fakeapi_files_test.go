package cli

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// The file calls are tested against a real control plane and sandbox
// (e2e/files_test.go).
var errFilesNotFaked = connect.NewError(connect.CodeUnimplemented, errors.New("the fake API has no file calls"))

func (f *fakeAPI) StatActorFile(context.Context, *connect.Request[torporv1.ActorFileRequest]) (*connect.Response[torporv1.FileInfo], error) {
	return nil, errFilesNotFaked
}

func (f *fakeAPI) ListActorFiles(context.Context, *connect.Request[torporv1.ActorFileRequest]) (*connect.Response[torporv1.ListActorFilesResponse], error) {
	return nil, errFilesNotFaked
}

func (f *fakeAPI) ReadActorFiles(context.Context, *connect.Request[torporv1.ReadActorFilesRequest], *connect.ServerStream[torporv1.FileChunk]) error {
	return errFilesNotFaked
}

func (f *fakeAPI) WriteActorFiles(context.Context, *connect.ClientStream[torporv1.WriteActorFilesRequest]) (*connect.Response[torporv1.WriteActorFilesResponse], error) {
	return nil, errFilesNotFaked
}
