package cli

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// Tags, forks and reverts are tested against the real server
// (realserver_test.go), whose engine decides them.
var errRealServerOnly = connect.NewError(connect.CodeUnimplemented, errors.New("tested against the real server"))

func (f *fakeAPI) RevertActor(context.Context, *connect.Request[torporv1.RevertActorRequest]) (*connect.Response[torporv1.Actor], error) {
	return nil, errRealServerOnly
}

func (f *fakeAPI) TagSnapshot(context.Context, *connect.Request[torporv1.TagSnapshotRequest]) (*connect.Response[torporv1.SnapshotTag], error) {
	return nil, errRealServerOnly
}

func (f *fakeAPI) ListSnapshotTags(context.Context, *connect.Request[torporv1.ListRequest]) (*connect.Response[torporv1.ListSnapshotTagsResponse], error) {
	return nil, errRealServerOnly
}

func (f *fakeAPI) UntagSnapshot(context.Context, *connect.Request[torporv1.DeleteRequest]) (*connect.Response[torporv1.DeleteResponse], error) {
	return nil, errRealServerOnly
}
