package node

import (
	"context"
	"crypto/x509"
	"net/http"
	"slices"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/identity"
)

// The node agent API's edge: who may call it (onlyControlPlane), the
// calls' messages in and out (agentAPI), and the one place its errors get
// their status codes (edgeErrors). Inside the node, errors are of a kind
// (errdefs).

// agentAPI is the node agent API's edge (torpor.v1.NodeAgentService): it
// takes each call's message out of its request, hands it to the slot
// lifecycle (slotMachine: operations that change a slot) or the data
// plane (exec, logs, files of a running workload) and puts the answer
// into a response. Neither of those sees an RPC type.
type agentAPI struct {
	life *slotMachine
	data *dataPlane
}

var _ torporv1connect.NodeAgentServiceHandler = (*agentAPI)(nil)

// handler is the API's HTTP handler, with its errors mapped once.
func (a *agentAPI) handler(opts ...connect.HandlerOption) (string, http.Handler) {
	return torporv1connect.NewNodeAgentServiceHandler(a, append(opts, connect.WithInterceptors(edgeErrors{}))...)
}

// edgeErrors gives every failed call, unary or streaming, the status code
// of its error's kind (errdefs.ToConnect); an error that has one already
// (a stream's own) keeps it.
type edgeErrors struct{}

var _ connect.Interceptor = edgeErrors{}

func (edgeErrors) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		return resp, errdefs.ToConnect(err)
	}
}

func (edgeErrors) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return errdefs.ToConnect(next(ctx, conn))
	}
}

// WrapStreamingClient leaves outgoing streams alone: the edge is where
// calls come in.
func (edgeErrors) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// respond is msg as a unary call's response, or err.
func respond[T any](msg *T, err error) (*connect.Response[T], error) {
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(msg), nil
}

// Run cold-boots the actor's workload with empty durable volumes.
func (a *agentAPI) Run(ctx context.Context, req *connect.Request[torporv1.RunRequest]) (*connect.Response[torporv1.RunResponse], error) {
	return respond(a.life.run(ctx, req.Msg))
}

// Restore brings the actor back from its snapshot.
func (a *agentAPI) Restore(ctx context.Context, req *connect.Request[torporv1.RestoreRequest]) (*connect.Response[torporv1.RestoreResponse], error) {
	return respond(a.life.restore(ctx, req.Msg))
}

// Checkpoint captures the actor to a snapshot.
func (a *agentAPI) Checkpoint(ctx context.Context, req *connect.Request[torporv1.CheckpointRequest]) (*connect.Response[torporv1.CheckpointResponse], error) {
	return respond(a.life.takeCheckpoint(ctx, req.Msg))
}

// Terminate stops the actor's workload and removes its volumes.
func (a *agentAPI) Terminate(ctx context.Context, req *connect.Request[torporv1.TerminateRequest]) (*connect.Response[torporv1.TerminateResponse], error) {
	return respond(a.life.terminate(ctx, req.Msg))
}

// DropCheckpoint removes a local checkpoint whose record is gone.
func (a *agentAPI) DropCheckpoint(ctx context.Context, req *connect.Request[torporv1.DropCheckpointRequest]) (*connect.Response[torporv1.DropCheckpointResponse], error) {
	return respond(a.life.dropCheckpoint(ctx, req.Msg))
}

// Stats reports a worker's workload and what it uses.
func (a *agentAPI) Stats(ctx context.Context, req *connect.Request[torporv1.StatsRequest]) (*connect.Response[torporv1.StatsResponse], error) {
	return respond(a.life.stats(ctx, req.Msg))
}

// Warm warms a free worker for a template's next actor.
func (a *agentAPI) Warm(ctx context.Context, req *connect.Request[torporv1.WarmRequest]) (*connect.Response[torporv1.WarmResponse], error) {
	return respond(a.life.prewarm(ctx, req.Msg))
}

// Exec runs a process in a running workload.
func (a *agentAPI) Exec(ctx context.Context, stream *connect.BidiStream[torporv1.ExecRequest, torporv1.ExecOutput]) error {
	return a.data.exec(ctx, stream)
}

// Logs streams an actor's log on this node.
func (a *agentAPI) Logs(ctx context.Context, req *connect.Request[torporv1.LogsRequest], stream *connect.ServerStream[torporv1.GetActorLogsResponse]) error {
	return a.data.actorLogs(ctx, req.Msg, stream.Send)
}

// StatFile describes one path of a running workload.
func (a *agentAPI) StatFile(ctx context.Context, req *connect.Request[torporv1.NodeFileRequest]) (*connect.Response[torporv1.FileInfo], error) {
	return respond(a.data.statFile(ctx, req.Msg))
}

// ListFiles lists a directory of a running workload.
func (a *agentAPI) ListFiles(ctx context.Context, req *connect.Request[torporv1.NodeFileRequest]) (*connect.Response[torporv1.ListActorFilesResponse], error) {
	return respond(a.data.listFiles(ctx, req.Msg))
}

// ReadFiles streams a file, or an archive of a path, of a running
// workload.
func (a *agentAPI) ReadFiles(ctx context.Context, req *connect.Request[torporv1.NodeReadFilesRequest], stream *connect.ServerStream[torporv1.FileChunk]) error {
	return a.data.readFiles(ctx, req.Msg, stream.Send)
}

// WriteFiles writes a file, or extracts an archive, into a running
// workload.
func (a *agentAPI) WriteFiles(ctx context.Context, stream *connect.ClientStream[torporv1.NodeWriteFilesRequest]) (*connect.Response[torporv1.WriteActorFilesResponse], error) {
	return respond(a.data.writeFiles(ctx, stream))
}

// onlyControlPlane lets through requests whose client certificate (which
// the TLS layer verified against the node's CA) is the control plane's.
func onlyControlPlane(creds *identity.Credentials, next http.Handler) http.Handler {
	want := identity.ServerID(creds.TrustDomain())
	errWriter := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			errWriter.Write(w, r, errdefs.ToConnect(errdefs.Errorf(errdefs.ErrUnauthenticated, "the node agent API needs the control plane's client certificate (%s)", want)))
			return
		}
		leaf := r.TLS.VerifiedChains[0][0]
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
			errWriter.Write(w, r, errdefs.ToConnect(errdefs.Errorf(errdefs.ErrPermissionDenied, "only the control plane (%s) may call the node agent API, not %v", want, leaf.URIs)))
			return
		}
		next.ServeHTTP(w, r)
	})
}
