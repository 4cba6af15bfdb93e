package identity

import (
	"crypto/x509"
	"errors"
	"regexp"
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
				issued, err := a.Join(ctx, secret, node, csrOf(t))
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
				secret := create(t, TokenRequest{Purpose: PurposeNodeJoin, Name: "node-1"})
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
				secret := create(t, TokenRequest{Purpose: PurposeNodeJoin, Name: "node-2"})
				wantRefused(t, join(secret, "node-3"), "made for node-2")
				if err := join(secret, "node-2"); err != nil {
					t.Fatal(err)
				}
			})
			t.Run("bad request does not spend the token", func(t *testing.T) {
				secret := create(t, TokenRequest{Purpose: PurposeNodeJoin})
				_, err := a.Join(ctx, secret, "node-4", []byte("junk"))
				var fe *validate.FieldError
				if !errors.As(err, &fe) || fe.Path != "csr" {
					t.Fatalf("err = %v, want a csr field error", err)
				}
				_, err = a.Join(ctx, secret, "Node_4", csrOf(t))
				if !errors.As(err, &fe) || fe.Path != "name" {
					t.Fatalf("err = %v, want a name field error", err)
				}
				if err := join(secret, "node-4"); err != nil {
					t.Fatal(err)
				}
			})
			t.Run("API token does not join", func(t *testing.T) {
				wantRefused(t, join(create(t, TokenRequest{Purpose: PurposeAPI, Spaces: []string{"s"}}), "node-1"), "purpose is api, not [node-join client-join]")
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

// An E2B key is shaped like E2B's keys, lasts a year by default, and is an
// API token of its one space: accepted where API tokens are, and listed
// and revoked like them.
func TestE2BKeys(t *testing.T) {
	a, clk := newAuthority(t, "sqlite")
	ctx := testContext(t)
	key, err := a.CreateToken(ctx, TokenRequest{Purpose: PurposeE2B, Spaces: []string{"team-a", "team-a"}})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{64}$`).MatchString(key.Secret) {
		t.Errorf("E2B key %q, want e2b_ and 64 lower-case hex digits", key.Secret)
	}
	if want := clk.Now().Add(DefaultE2BKeyTTL); !key.Expires.Equal(want) {
		t.Errorf("expires %s, want %s", key.Expires, want)
	}
	spaces, err := a.AuthenticateAPIToken(ctx, key.Secret)
	if err != nil || !slices.Equal(spaces, []string{"team-a"}) {
		t.Fatalf("spaces = %v, %v; want [team-a]", spaces, err)
	}
	if _, err := a.Join(ctx, key.Secret, "node-1", csrOf(t)); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("an E2B key joins a node: %v", err)
	}
	forged := "e2b_" + strings.Repeat("0", 64)
	if _, err := a.AuthenticateAPIToken(ctx, forged); !errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), "unknown") {
		t.Errorf("unknown E2B key: err = %v, want invalid token (unknown)", err)
	}
	infos, err := a.ListTokens(ctx)
	if err != nil || len(infos) != 1 || infos[0].ID != key.ID || infos[0].Purpose != PurposeE2B || !slices.Equal(infos[0].Spaces, []string{"team-a"}) {
		t.Fatalf("ListTokens = %+v, %v", infos, err)
	}
	if _, err := a.RevokeToken(ctx, key.ID[:12]); err != nil {
		t.Fatal(err)
	}
	if _, err := a.AuthenticateAPIToken(ctx, key.Secret); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("revoked E2B key: err = %v, want invalid token", err)
	}
	short, err := a.CreateToken(ctx, TokenRequest{Purpose: PurposeE2B, Spaces: []string{"b"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	if _, err := a.AuthenticateAPIToken(ctx, short.Secret); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("expired E2B key: err = %v, want invalid token", err)
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
		{"bad name", TokenRequest{Purpose: PurposeNodeJoin, Name: "Node 1"}, "name"},
		{"join token with spaces", TokenRequest{Purpose: PurposeNodeJoin, Spaces: []string{"a"}}, "spaces"},
		{"API token with a name", TokenRequest{Purpose: PurposeAPI, Name: "n", Spaces: []string{"a"}}, "name"},
		{"API token without spaces", TokenRequest{Purpose: PurposeAPI}, "spaces"},
		{"bad space name", TokenRequest{Purpose: PurposeAPI, Spaces: []string{"ok", "Not OK"}}, "spaces[1]"},
		{"node join token with a role", TokenRequest{Purpose: PurposeNodeJoin, Role: RoleAdmin}, "role"},
		{"client join token without a role", TokenRequest{Purpose: PurposeClientJoin}, "role"},
		{"client join token with an unknown role", TokenRequest{Purpose: PurposeClientJoin, Role: "root"}, "role"},
		{"admin client with spaces", TokenRequest{Purpose: PurposeClientJoin, Role: RoleAdmin, Spaces: []string{"a"}}, "spaces"},
		{"user client without spaces", TokenRequest{Purpose: PurposeClientJoin, Role: RoleUser}, "spaces"},
		{"bad client space", TokenRequest{Purpose: PurposeClientJoin, Role: RoleRouter, Spaces: []string{"A"}}, "spaces[0]"},
		{"negative ttl", TokenRequest{Purpose: PurposeNodeJoin, TTL: -time.Second}, "ttl"},
		{"ttl too long", TokenRequest{Purpose: PurposeAPI, Spaces: []string{"a"}, TTL: MaxTokenTTL + time.Second}, "ttl"},
		{"E2B key without a space", TokenRequest{Purpose: PurposeE2B}, "spaces"},
		{"E2B key of two spaces", TokenRequest{Purpose: PurposeE2B, Spaces: []string{"a", "b"}}, "spaces"},
		{"E2B key with a bad space", TokenRequest{Purpose: PurposeE2B, Spaces: []string{"A"}}, "spaces[0]"},
		{"E2B key with a name", TokenRequest{Purpose: PurposeE2B, Name: "n", Spaces: []string{"a"}}, "name"},
		{"E2B key with a role", TokenRequest{Purpose: PurposeE2B, Role: RoleUser, Spaces: []string{"a"}}, "role"},
		{"E2B key ttl too long", TokenRequest{Purpose: PurposeE2B, Spaces: []string{"a"}, TTL: MaxTokenTTL + time.Second}, "ttl"},
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

func TestListAndRevokeTokens(t *testing.T) {
	a, clk := newAuthority(t, "sqlite")
	ctx := testContext(t)
	api, err := a.CreateToken(ctx, TokenRequest{Purpose: PurposeAPI, Spaces: []string{"s"}})
	if err != nil {
		t.Fatal(err)
	}
	join, err := a.CreateToken(ctx, TokenRequest{Purpose: PurposeClientJoin, Name: "r1", Role: RoleRouter, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ids := func() []string {
		t.Helper()
		infos, err := a.ListTokens(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, info := range infos {
			if strings.Contains(info.ID, "torpor-") {
				t.Fatalf("listed token %+v shows its secret", info)
			}
			out = append(out, info.ID)
		}
		return out
	}
	if got, want := ids(), slices.Sorted(slices.Values([]string{api.ID, join.ID})); !slices.Equal(got, want) {
		t.Fatalf("tokens %v, want %v", got, want)
	}
	t.Run("revoke needs an unambiguous prefix", func(t *testing.T) {
		_, err := a.RevokeToken(ctx, api.ID[:4])
		var fe *validate.FieldError
		if !errors.As(err, &fe) || fe.Path != "id" {
			t.Fatalf("short prefix: err = %v, want a field error on id", err)
		}
		if _, err := a.RevokeToken(ctx, "not-an-id"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("unknown id: err = %v, want not found", err)
		}
	})
	t.Run("a revoked token no longer works", func(t *testing.T) {
		info, err := a.RevokeToken(ctx, strings.ToUpper(api.ID[:10]))
		if err != nil || info.ID != api.ID || info.Purpose != PurposeAPI || !slices.Equal(info.Spaces, []string{"s"}) {
			t.Fatalf("RevokeToken = %+v, %v", info, err)
		}
		if _, err := a.AuthenticateAPIToken(ctx, api.Secret); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("revoked token: err = %v, want invalid token", err)
		}
	})
	t.Run("expired tokens are not listed", func(t *testing.T) {
		clk.Advance(time.Minute)
		if got := ids(); len(got) != 0 {
			t.Errorf("tokens %v after expiry, want none", got)
		}
	})
}

func TestClients(t *testing.T) {
	for _, backend := range storetest.Backends {
		t.Run(backend, func(t *testing.T) {
			a, _ := newAuthority(t, backend)
			ctx := testContext(t)
			join := func(t *testing.T, name string, role Role, spaces ...string) *Issued {
				t.Helper()
				tok, err := a.CreateToken(ctx, TokenRequest{Purpose: PurposeClientJoin, Name: name, Role: role, Spaces: spaces})
				if err != nil {
					t.Fatal(err)
				}
				issued, err := a.Join(ctx, tok.Secret, name, csrOf(t))
				if err != nil {
					t.Fatal(err)
				}
				verify(t, a, issued.Certificate, x509.ExtKeyUsageClientAuth)
				return issued
			}
			first := join(t, "router-1", RoleRouter, "b", "a")
			name, uid, ok := ClientFromCertificate(first.Certificate, a.TrustDomain())
			if !ok || name != "router-1" || first.SPIFFEID != ClientID(a.TrustDomain(), "router-1") {
				t.Fatalf("client certificate names %v (%s, %s)", first.Certificate.URIs, name, uid)
			}
			if _, ok := NodeFromCertificate(first.Certificate, a.TrustDomain()); ok {
				t.Errorf("a client certificate passes for a node's")
			}
			c, err := a.AuthenticateClient(ctx, name, uid)
			if err != nil || c.Role != RoleRouter || !slices.Equal(c.Spaces, []string{"a", "b"}) {
				t.Fatalf("AuthenticateClient = %+v, %v", c, err)
			}
			t.Run("renewal keeps the client", func(t *testing.T) {
				renewed, err := a.RenewClient(ctx, name, uid, csrOf(t))
				if err != nil {
					t.Fatal(err)
				}
				if _, got, _ := ClientFromCertificate(renewed.Certificate, a.TrustDomain()); got != uid {
					t.Errorf("renewed certificate carries uid %s, want %s", got, uid)
				}
			})
			t.Run("joining again replaces the client", func(t *testing.T) {
				second := join(t, "router-1", RoleUser, "a")
				_, uid2, _ := ClientFromCertificate(second.Certificate, a.TrustDomain())
				if uid2 == uid {
					t.Fatalf("the new client kept uid %s", uid)
				}
				for what, err := range map[string]error{
					"authenticate": func() error { _, err := a.AuthenticateClient(ctx, name, uid); return err }(),
					"renew":        func() error { _, err := a.RenewClient(ctx, name, uid, csrOf(t)); return err }(),
				} {
					if !errors.Is(err, ErrUnknownClient) {
						t.Errorf("%s with the old certificate: err = %v, want unknown client", what, err)
					}
				}
				uid = uid2
			})
			t.Run("list and delete", func(t *testing.T) {
				join(t, "admin-1", RoleAdmin)
				clients, err := a.ListClients(ctx)
				if err != nil || len(clients) != 2 || clients[0].Name != "admin-1" || clients[1].Name != "router-1" || clients[1].Role != RoleUser {
					t.Fatalf("ListClients = %+v, %v", clients, err)
				}
				if err := a.DeleteClient(ctx, "router-1"); err != nil {
					t.Fatal(err)
				}
				if _, err := a.AuthenticateClient(ctx, "router-1", uid); !errors.Is(err, ErrUnknownClient) {
					t.Errorf("deleted client: err = %v, want unknown client", err)
				}
				if err := a.DeleteClient(ctx, "router-1"); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("deleting twice: err = %v, want not found", err)
				}
			})
			t.Run("a node join token makes no client", func(t *testing.T) {
				tok, err := a.CreateToken(ctx, TokenRequest{Purpose: PurposeNodeJoin})
				if err != nil {
					t.Fatal(err)
				}
				issued, err := a.Join(ctx, tok.Secret, "n9", csrOf(t))
				if err != nil {
					t.Fatal(err)
				}
				if _, _, ok := ClientFromCertificate(issued.Certificate, a.TrustDomain()); ok {
					t.Errorf("a node certificate passes for a client's")
				}
			})
		})
	}
}
