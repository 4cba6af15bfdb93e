package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// nodeAgents reaches node agents at the address each registered. The
// address is read from the store on every call so a re-registered node is
// reached at its new address; clients are kept per address.
type nodeAgents struct {
	store  store.Store
	client *http.Client

	mu      sync.Mutex
	clients map[string]torporv1connect.NodeAgentServiceClient
}

func newNodeAgents(st store.Store, client *http.Client) *nodeAgents {
	return &nodeAgents{store: st, client: client, clients: map[string]torporv1connect.NodeAgentServiceClient{}}
}

func (n *nodeAgents) Agent(ctx context.Context, node string) (workflow.NodeAgent, error) {
	rec, err := n.store.Nodes().Get(ctx, "", node)
	if errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("node %s is not registered", node))
	}
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	c, ok := n.clients[rec.GetAddress()]
	if !ok {
		c = torporv1connect.NewNodeAgentServiceClient(n.client, rec.GetAddress())
		n.clients[rec.GetAddress()] = c
	}
	return c, nil
}
