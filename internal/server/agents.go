package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/tracing"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// nodeAgents reaches node agents at the address each registered, over
// mutual TLS: the agent must present its own node's certificate. The
// address is read from the store on every call so a re-registered node is
// reached at its new address; clients are kept per node and address.
type nodeAgents struct {
	store  store.Store
	tlsFor func(ctx context.Context, node string) (*tls.Config, error)

	mu      sync.Mutex
	clients map[agentKey]torporv1connect.NodeAgentServiceClient
	// https are the HTTP clients under clients, for close.
	https []*http.Client
}

type agentKey struct{ node, address string }

func newNodeAgents(st store.Store, tlsFor func(ctx context.Context, node string) (*tls.Config, error)) *nodeAgents {
	return &nodeAgents{store: st, tlsFor: tlsFor, clients: map[agentKey]torporv1connect.NodeAgentServiceClient{}}
}

func (n *nodeAgents) Agent(ctx context.Context, node string) (workflow.NodeAgent, error) {
	return n.client(ctx, node)
}

// client is the node's agent with every call, the data plane's streams
// included.
func (n *nodeAgents) client(ctx context.Context, node string) (torporv1connect.NodeAgentServiceClient, error) {
	rec, err := n.store.Nodes().Get(ctx, "", node)
	if errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("node %s is not registered", node))
	}
	if err != nil {
		return nil, err
	}
	key := agentKey{node, rec.GetAddress()}
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.clients[key]; ok {
		return c, nil
	}
	// RegisterNode accepts only https addresses; a record from before
	// that rule must not be called in the clear.
	if u, err := url.Parse(key.address); err != nil || u.Scheme != "https" {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("node %s registered address %q, which is not an https URL: it must register again", node, key.address))
	}
	cfg, err := n.tlsFor(ctx, node)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("call node %s: %w", node, err))
	}
	hc := agentClient(cfg)
	c := torporv1connect.NewNodeAgentServiceClient(hc, key.address, connect.WithInterceptors(tracing.Interceptor()))
	n.clients[key] = c
	n.https = append(n.https, hc)
	return c, nil
}

// close drops the connections to node agents no call uses, and the dials
// no call waits for any more: a call its caller gave up leaves its
// transport dialing (up to agentClient's handshake bound) for the pool.
func (n *nodeAgents) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, hc := range n.https {
		hc.CloseIdleConnections()
	}
}
