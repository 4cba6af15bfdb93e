package node

// The node's own identity: an identity.Member of kind node, its
// certificate kept in the state directory. The agent talks to the control
// plane only over mutual TLS with it, serves its API with it, and accepts
// only the control plane's certificate (spiffe://<trust domain>/server).

import (
	"log/slog"
	"path/filepath"

	"github.com/torpor-dev/torpor/internal/identity"
)

// credentialsFile, in the state directory, keeps the node's key,
// certificate chain and trust bundle.
const credentialsFile = "node-credentials.json"

// nodeMember is the node as an identity.Member: its certificate, kept in
// the state directory.
func nodeMember(cfg Config, log *slog.Logger) *identity.Member {
	return &identity.Member{
		Kind:            identity.MemberNode,
		Name:            cfg.Name,
		ServerURL:       cfg.ServerURL,
		File:            filepath.Join(cfg.StateDir, credentialsFile),
		CAFingerprint:   cfg.CAFingerprint,
		JoinToken:       cfg.JoinToken,
		KubernetesToken: cfg.KubernetesToken,
		JoinRetryMax:    cfg.HeartbeatInterval,
		CallTimeout:     controlPlaneTimeout,
		Logger:          log,
	}
}
