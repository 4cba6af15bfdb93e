package server

// The file calls: each resumes the actor, counts as activity while it
// lasts (sessions) and is served by the node agent holding the actor,
// which runs the file helper inside the sandbox (internal/node,
// guestfiles.go). Paths are checked here first, so a path climbing out
// with ".." is refused before any actor is resumed.

import (
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/guestfs"
)

// checkFileRequest checks what a file call names before anything else.
func checkFileRequest(f *torporv1.ActorFileRequest) error {
	if err := keyOf(f.GetSpace(), f.GetName(), true); err != nil {
		return err
	}
	if err := guestfs.CheckPath(f.GetPath()); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return nil
}

// fileCall resumes the actor of f, keeping it active until end, and
// returns it with its node's agent and the node's request for f.
func (s *actorService) fileCall(ctx context.Context, f *torporv1.ActorFileRequest) (a *torporv1.Actor, agent torporv1connect.NodeAgentServiceClient, req *torporv1.NodeFileRequest, end func(), err error) {
	if err := checkFileRequest(f); err != nil {
		return nil, nil, nil, nil, err
	}
	end = s.sessions.begin(ctx, f.GetSpace(), f.GetName())
	a, agent, err = s.placed(ctx, f.GetSpace(), f.GetName())
	if err != nil {
		end()
		return nil, nil, nil, nil, err
	}
	container := f.GetContainer()
	if container == "" {
		if cs := a.GetStatus().GetCurrentTemplateSpec().GetContainers(); len(cs) > 0 {
			container = cs[0].GetName()
		}
	}
	req = &torporv1.NodeFileRequest{
		Worker: a.GetStatus().GetWorker().GetName(), ActorUid: a.GetMetadata().GetUid(), Container: container, Path: f.GetPath(),
	}
	return a, agent, req, end, nil
}

func (s *actorService) StatActorFile(ctx context.Context, req *connect.Request[torporv1.ActorFileRequest]) (*connect.Response[torporv1.FileInfo], error) {
	a, agent, nreq, end, err := s.fileCall(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	defer end()
	resp, err := agent.StatFile(ctx, connect.NewRequest(nreq))
	if err != nil {
		return nil, dataPlaneError("stat a file of", a, err)
	}
	return connect.NewResponse(resp.Msg), nil
}

func (s *actorService) ListActorFiles(ctx context.Context, req *connect.Request[torporv1.ActorFileRequest]) (*connect.Response[torporv1.ListActorFilesResponse], error) {
	a, agent, nreq, end, err := s.fileCall(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	defer end()
	resp, err := agent.ListFiles(ctx, connect.NewRequest(nreq))
	if err != nil {
		return nil, dataPlaneError("list files of", a, err)
	}
	return connect.NewResponse(resp.Msg), nil
}

func (s *actorService) ReadActorFiles(ctx context.Context, req *connect.Request[torporv1.ReadActorFilesRequest], stream *connect.ServerStream[torporv1.FileChunk]) error {
	a, agent, nreq, end, err := s.fileCall(ctx, req.Msg.GetFile())
	if err != nil {
		return err
	}
	defer end()
	chunks, err := agent.ReadFiles(ctx, connect.NewRequest(&torporv1.NodeReadFilesRequest{File: nreq, Archive: req.Msg.GetArchive()}))
	if err != nil {
		return dataPlaneError("read files of", a, err)
	}
	defer chunks.Close()
	for chunks.Receive() {
		if err := stream.Send(chunks.Msg()); err != nil {
			return err
		}
	}
	if err := chunks.Err(); err != nil {
		return dataPlaneError("read files of", a, err)
	}
	return nil
}

func (s *actorService) WriteActorFiles(ctx context.Context, stream *connect.ClientStream[torporv1.WriteActorFilesRequest]) (*connect.Response[torporv1.WriteActorFilesResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, invalidArgument("file", "required")
	}
	first := stream.Msg()
	a, agent, nreq, end, err := s.fileCall(ctx, first.GetFile())
	if err != nil {
		return nil, err
	}
	defer end()
	node := agent.WriteFiles(ctx)
	msg := &torporv1.NodeWriteFilesRequest{File: nreq, Archive: first.GetArchive(), Mode: first.GetMode(), Data: first.GetData()}
	for {
		// io.EOF: the node answered early (a refusal), which
		// CloseAndReceive returns.
		if err := node.Send(msg); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, dataPlaneError("write files of", a, err)
		}
		if !stream.Receive() {
			if err := stream.Err(); err != nil {
				return nil, err
			}
			break
		}
		msg = &torporv1.NodeWriteFilesRequest{Data: stream.Msg().GetData()}
	}
	resp, err := node.CloseAndReceive()
	if err != nil {
		return nil, dataPlaneError("write files of", a, err)
	}
	return connect.NewResponse(resp.Msg), nil
}
