package identity

import (
	"crypto/x509"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/validate"
)

func TestJoinTokens(t *testing.T) {
	for _, backend := range storetest.Backends {
		t.Run(backend, func(t *testing.T) {
			a, clk := newAuthority(t, backend)
			ctx := testContext(t)
			create := func(t *testing.T, req TokenRequest) string {
				t.Helper()
				tok, err := a.CreateToken(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				return tok.Secret
			}
			join := func(secret, node string) error {
				issued, err := a.JoinNode(ctx, secret, node, csrOf(t))
				if err != nil {
					return err
				}
				if got, ok := NodeFromCertificate(issued.Certificate, a.TrustDomain()); !ok || got != node {
					t.Errorf("joined as %s, certificate names %v", node, issued.Certificate.URIs)
				}
				verify(t, a, issued.Certificate, x509.ExtKeyUsageClientAuth)
				return nil
			}
			wantRefused := func(t *testing.T, err error, reason string) {
				t.Helper()
				if !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), reason) {
					t.Fatalf("err = %v, want an invalid token (%s)", err, reason)
				}
			}

			t.Run("valid token joins its node, once", func(t *testing.T) {
				secret := create(t, TokenRequest{Purpose: PurposeNodeJoin, Node: "node-1"})
				if err := join(secret, "node-1"); err != nil {
					t.Fatal(err)
				}
				wantRefused(t, join(secret, "node-1"), "already used")
			})
			t.Run("token without a node joins any name", func(t *testing.T) {
				if err := join(create(t, TokenRequest{Purpose: PurposeNodeJoin}), "any-node"); err != nil {
					t.Fatal(err)
				}
			})
			t.Run("unknown token", func(t *testing.T) {
				wantRefused(t, join(tokenPrefix+"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "node-1"), "unknown")
				wantRefused(t, join("", "node-1"), "not a torpor token")
			})
			t.Run("expired token is refused and removed", func(t *testing.T) {
				secret := create(t, TokenRequest{Purpose: PurposeNodeJoin, TTL: time.Minute})
				clk.Advance(time.Minute)
				wantRefused(t, join(secret, "node-1"), "expired")
				if _, err := a.secrets.GetSecret(ctx, tokenSecretName(secret)); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("expired token record: %v, want it removed", err)
				}
			})
			t.Run("token of another node is refused and not spent", func(t *testing.T) {
				secret := create(t, TokenRequest{Purpose: PurposeNodeJoin, Node: "node-2"})
				wantRefused(t, join(secret, "node-3"), "made for node node-2")
				if err := join(secret, "node-2"); err != nil {
					t.Fatal(err)
				}
			})
			t.Run("bad request does not spend the token", func(t *testing.T) {
				secret := create(t, TokenRequest{Purpose: PurposeNodeJoin})
				_, err := a.JoinNode(ctx, secret, "node-4", []byte("junk"))
				var fe *validate.FieldError
				if !errors.As(err, &fe) || fe.Path != "csr" {
					t.Fatalf("err = %v, want a csr field error", err)
				}
				_, err = a.JoinNode(ctx, secret, "Node_4", csrOf(t))
				if !errors.As(err, &fe) || fe.Path != "node" {
					t.Fatalf("err = %v, want a node field error", err)
				}
				if err := join(secret, "node-4"); err != nil {
					t.Fatal(err)
				}
			})
			t.Run("API token does not join", func(t *testing.T) {
				wantRefused(t, join(create(t, TokenRequest{Purpose: PurposeAPI, Spaces: []string{"s"}}), "node-1"), "purpose is api, not node-join")
			})
			t.Run("concurrent joins with one token: one succeeds", func(t *testing.T) {
				secret := create(t, TokenRequest{Purpose: PurposeNodeJoin})
				const joiners = 6
				errs := make([]error, joiners)
				var wg sync.WaitGroup
				for i := range joiners {
					wg.Go(func() { errs[i] = join(secret, "racer") })
				}
				wg.Wait()
				ok := 0
				for _, err := range errs {
					switch {
					case err == nil:
						ok++
					case !errors.Is(err, ErrInvalidToken):
						t.Errorf("join: %v", err)
					}
				}
				if ok != 1 {
					t.Errorf("%d joins succeeded with one token, want 1", ok)
				}
			})
		})
	}
}

func TestAPITokens(t *testing.T) {
	a, clk := newAuthority(t, "sqlite")
	ctx := testContext(t)
	tok, err := a.CreateToken(ctx, TokenRequest{Purpose: PurposeAPI, Spaces: []string{"b", "a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := clk.Now().Add(DefaultAPITokenTTL); !tok.Expires.Equal(want) {
		t.Errorf("expires %s, want %s", tok.Expires, want)
	}
	for range 2 { // reusable until it expires
		spaces, err := a.AuthenticateAPIToken(ctx, tok.Secret)
		if err != nil || !slices.Equal(spaces, []string{"a", "b"}) {
			t.Fatalf("spaces = %v, %v; want [a b]", spaces, err)
		}
	}
	join, err := a.CreateToken(ctx, TokenRequest{Purpose: PurposeNodeJoin})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.AuthenticateAPIToken(ctx, join.Secret); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("join token as API token: err = %v, want invalid token", err)
	}
	clk.Advance(DefaultAPITokenTTL)
	if _, err := a.AuthenticateAPIToken(ctx, tok.Secret); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("expired API token: err = %v, want invalid token", err)
	}
}

func TestCreateTokenChecksRequest(t *testing.T) {
	a, _ := newAuthority(t, "sqlite")
	cases := []struct {
		name  string
		req   TokenRequest
		field string
	}{
		{"no purpose", TokenRequest{}, "purpose"},
		{"bad node name", TokenRequest{Purpose: PurposeNodeJoin, Node: "Node 1"}, "node"},
		{"join token with spaces", TokenRequest{Purpose: PurposeNodeJoin, Spaces: []string{"a"}}, "spaces"},
		{"API token with a node", TokenRequest{Purpose: PurposeAPI, Node: "n", Spaces: []string{"a"}}, "node"},
		{"API token without spaces", TokenRequest{Purpose: PurposeAPI}, "spaces"},
		{"bad space name", TokenRequest{Purpose: PurposeAPI, Spaces: []string{"ok", "Not OK"}}, "spaces[1]"},
		{"negative ttl", TokenRequest{Purpose: PurposeNodeJoin, TTL: -time.Second}, "ttl"},
		{"ttl too long", TokenRequest{Purpose: PurposeAPI, Spaces: []string{"a"}, TTL: MaxTokenTTL + time.Second}, "ttl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.CreateToken(testContext(t), tc.req)
			var fe *validate.FieldError
			if !errors.As(err, &fe) || fe.Path != tc.field {
				t.Errorf("err = %v, want a field error on %s", err, tc.field)
			}
		})
	}
}
