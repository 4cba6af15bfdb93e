package node

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/runtime/fake"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

// savedLeaf reads the node certificate an agent saved.
func savedLeaf(t *testing.T, n *fakeNode) *x509.Certificate {
	t.Helper()
	creds, err := n.agent.member.cert.LoadCredentials()
	if err != nil {
		t.Fatal(err)
	}
	return creds.Keypair().Certificate().Leaf
}

// TestJoinOnceThenRestartWithoutToken: the first run spends the join
// token on a certificate naming the node, kept privately in the state
// directory; the next run uses it and asks for no token.
func TestJoinOnceThenRestartWithoutToken(t *testing.T) {
	n := newFakeNode(t)
	fi, err := os.Stat(n.agent.member.cert.File)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("credentials file mode %v, want 0600", fi.Mode().Perm())
	}
	leaf := savedLeaf(t, n)
	if want := identity.NodeID(identity.DefaultTrustDomain, n.name); len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		t.Fatalf("saved certificate names %v, want %s", leaf.URIs, want)
	}

	n.cfg.JoinToken = func(context.Context) (string, error) {
		t.Error("the restarted agent asked for a join token")
		return "", errors.New("no token")
	}
	n.registry.forget(n.name, nil)
	n.restart(t)
	waitFor(t, "registration after the restart", func() bool { return n.registry.registration(n.name) != nil })
	if again := savedLeaf(t, n); !again.Equal(leaf) {
		t.Errorf("the restart replaced the certificate (serial %s, was %s)", again.SerialNumber, leaf.SerialNumber)
	}
	if _, err := n.run(context.Background(), "a1", "op-1", 0); err != nil {
		t.Fatalf("run after the restart: %v", err)
	}
}

// TestJoinRefused: an agent without a usable certificate that cannot join
// stops with an error saying why, instead of running unidentified.
func TestJoinRefused(t *testing.T) {
	reg := newRegistry(t)
	objects, err := snapshot.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	token := func(tok string) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { return tok, nil }
	}
	cases := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"forged token", func(c *Config) { c.JoinToken = token("torpor-forged") }, "invalid token"},
		{"token of another node", func(c *Config) { c.JoinToken = token(reg.token(t, "n2")) }, "not n1"},
		{"token spent", func(c *Config) {
			tok := reg.token(t, "n1")
			if _, err := reg.ca.Join(context.Background(), tok, "n1", mustCSR(t)); err != nil {
				t.Fatal(err)
			}
			c.JoinToken = token(tok)
		}, "already used"},
		{"another CA pinned", func(c *Config) {
			c.CAFingerprint = "sha256:" + strings.Repeat("0", 64)
		}, "fingerprint"},
		{"no token", func(c *Config) { c.JoinToken = nil }, "torpor token create --node n1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Name: "n1", Listen: "127.0.0.1:0", Workers: 1, StateDir: t.TempDir(), Runtime: fake.New(), Snapshots: objects,
				Network: loopback{int(loopbackNets.Add(1))%200 + 20}, Logger: testLogger(t)}
			reg.join(t, &cfg)
			tc.change(&cfg)
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = a.Run(ctx)
			if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, want a prompt error containing %q", err, tc.want)
			}
			if _, err := os.Stat(a.member.cert.File); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("credentials saved after a refused join: %v", err)
			}
		})
	}
}

func mustCSR(t *testing.T) []byte {
	t.Helper()
	_, csr, err := identity.NewCSR()
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

// TestNodeCertificateRenewed: a certificate about to expire is renewed
// with a new key and saved, and the restarted agent uses the renewed one.
func TestNodeCertificateRenewed(t *testing.T) {
	reg := newRegistryWithCA(t, identity.Config{MemberCertTTL: 3 * time.Second})
	objects, err := snapshot.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{name: "n1", rt: fake.New(), net: loopback{int(loopbackNets.Add(1))%200 + 20}, registry: reg, tmpl: appTemplate(t)}
	n.cfg = Config{Name: n.name, Workers: 1, StateDir: t.TempDir(), Runtime: n.rt, Snapshots: objects, Network: n.net, HeartbeatInterval: 500 * time.Millisecond}
	reg.join(t, &n.cfg)
	n.start(t)
	joined := savedLeaf(t, n)
	waitFor(t, "two renewals", func() bool { return reg.renewals.Load() >= 2 })
	renewed := savedLeaf(t, n)
	sameKey := renewed.PublicKey.(*ecdsa.PublicKey).Equal(joined.PublicKey)
	if !renewed.NotAfter.After(joined.NotAfter) || sameKey {
		t.Fatalf("saved certificate expires %s (same key: %v); the joined one %s", renewed.NotAfter, sameKey, joined.NotAfter)
	}
	// Long after the joined certificate expired, a new agent starts on the
	// renewed one without a token.
	time.Sleep(time.Until(joined.NotAfter) + time.Second)
	n.cfg.JoinToken = nil
	reg.forget(n.name, nil)
	n.restart(t)
	waitFor(t, "registration on the renewed certificate", func() bool { return reg.registration(n.name) != nil })
}

// TestAgentAcceptsOnlyTheControlPlane: the agent API answers the control
// plane's certificate only, not a caller without one, nor another node.
func TestAgentAcceptsOnlyTheControlPlane(t *testing.T) {
	n := newFakeNode(t)
	reg := n.registry
	key, csr, err := identity.NewCSR()
	if err != nil {
		t.Fatal(err)
	}
	other, err := reg.ca.IssueNodeCertificate("n2", csr)
	if err != nil {
		t.Fatal(err)
	}
	otherCert, err := identity.TLSCertificate(key, other.Chain)
	if err != nil {
		t.Fatal(err)
	}
	peer := identity.NodeID(reg.ca.TrustDomain(), n.name)
	clientWith := func(cert *identity.Keypair) torporv1connect.NodeAgentServiceClient {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: identity.ClientTLSConfig(cert, reg.roots, peer), DisableKeepAlives: true}}
		return torporv1connect.NewNodeAgentServiceClient(hc, n.url)
	}
	stats := func(c torporv1connect.NodeAgentServiceClient) error {
		_, err := c.Stats(context.Background(), connect.NewRequest(&torporv1.StatsRequest{Worker: n.worker(0)}))
		return err
	}
	if err := stats(n.client); err != nil {
		t.Fatalf("the control plane: %v", err)
	}
	wantCode(t, stats(clientWith(nil)), connect.CodeUnauthenticated)
	wantCode(t, stats(clientWith(identity.NewKeypair(otherCert))), connect.CodePermissionDenied)
}
