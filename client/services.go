package client

import (
	"log/slog"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/identity"
)

// Client holds a connect client for each service of the control plane's
// API, all over one connection. (NodeAgentService is served by node
// agents to the control plane only.)
type Client struct {
	Spaces    torporv1connect.SpaceServiceClient
	Templates torporv1connect.TemplateServiceClient
	Actors    torporv1connect.ActorServiceClient
	Workers   torporv1connect.WorkerServiceClient
	Snapshots torporv1connect.SnapshotServiceClient
	Identity  torporv1connect.IdentityServiceClient
	// Nodes lists and shows node agents (registering is theirs).
	Nodes torporv1connect.NodeServiceClient
}

// New connects to the API conn names; opts apply to every service client
// (interceptors, compression, the gRPC protocol instead of connect's).
func New(conn Connection, opts ...connect.ClientOption) (*Client, error) {
	hc, err := conn.HTTPClient()
	if err != nil {
		return nil, err
	}
	base := conn.Server
	return &Client{
		Spaces:    torporv1connect.NewSpaceServiceClient(hc, base, opts...),
		Templates: torporv1connect.NewTemplateServiceClient(hc, base, opts...),
		Actors:    torporv1connect.NewActorServiceClient(hc, base, opts...),
		Workers:   torporv1connect.NewWorkerServiceClient(hc, base, opts...),
		Snapshots: torporv1connect.NewSnapshotServiceClient(hc, base, opts...),
		Identity:  torporv1connect.NewIdentityServiceClient(hc, base, opts...),
		Nodes:     torporv1connect.NewNodeServiceClient(hc, base, opts...),
	}, nil
}

// member is the logged-in client (Client and Credentials) as a member of
// the installation, whose certificate it loads and renews.
func (c Connection) member() *identity.Member {
	return &identity.Member{
		Kind: identity.MemberClient, Name: c.Client, ServerURL: c.Server, File: c.Credentials,
		Logger: slog.New(slog.DiscardHandler),
	}
}
