package node

// The node's own identity: an identity.Member of kind node, its
// certificate kept in the state directory. The agent talks to the control
// plane only over mutual TLS with it, serves its API with it, and accepts
// only the control plane's certificate (spiffe://<trust domain>/server).

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"

	"connectrpc.com/connect"

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

// onlyControlPlane lets through requests whose client certificate (which
// the TLS layer verified against the node's CA) is the control plane's.
func onlyControlPlane(creds *identity.Credentials, next http.Handler) http.Handler {
	want := identity.ServerID(creds.TrustDomain())
	errWriter := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			errWriter.Write(w, r, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("the node agent API needs the control plane's client certificate (%s)", want)))
			return
		}
		leaf := r.TLS.VerifiedChains[0][0]
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
			errWriter.Write(w, r, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("only the control plane (%s) may call the node agent API, not %v", want, leaf.URIs)))
			return
		}
		next.ServeHTTP(w, r)
	})
}
