package identity

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/validate"
)

// jwksKeys decodes a JWKS document the way a relying party would.
func jwksKeys(t *testing.T, doc []byte) map[string]*ecdsa.PublicKey {
	t.Helper()
	var set struct {
		Keys []struct{ Kty, Crv, X, Y, Kid, Use, Alg string }
	}
	if err := json.Unmarshal(doc, &set); err != nil {
		t.Fatalf("JWKS %s: %v", doc, err)
	}
	keys := map[string]*ecdsa.PublicKey{}
	for _, k := range set.Keys {
		if k.Kty != "EC" || k.Crv != "P-256" || k.Alg != "ES256" || k.Use != "sig" || k.Kid == "" {
			t.Fatalf("JWKS key %+v: want an EC P-256 ES256 signing key with a kid", k)
		}
		x, errX := base64.RawURLEncoding.DecodeString(k.X)
		y, errY := base64.RawURLEncoding.DecodeString(k.Y)
		if errX != nil || errY != nil {
			t.Fatalf("JWKS key %s: coordinates: %v %v", k.Kid, errX, errY)
		}
		pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
		if err != nil {
			t.Fatalf("JWKS key %s: %v", k.Kid, err)
		}
		keys[k.Kid] = pub
	}
	return keys
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %s %q %v", url, resp.Status, body, err)
	}
	return body
}

func TestJWTVerifiesWithPublishedKeys(t *testing.T) {
	ctx := testContext(t)
	clk := newClock()
	loader := NewLoader(openStore(t, ctx, storetest.URL(t, "sqlite")), Config{Issuer: testIssuer, Now: clk.Now})
	srv := httptest.NewServer(loader.WellKnown(slog.New(slog.DiscardHandler)))
	defer srv.Close()

	var discovery struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.Unmarshal(get(t, srv.URL+DiscoveryPath), &discovery); err != nil {
		t.Fatal(err)
	}
	if discovery.Issuer != testIssuer || discovery.JWKSURI != testIssuer+JWKSPath {
		t.Errorf("discovery = %+v, want issuer %s and its JWKS", discovery, testIssuer)
	}
	keys := jwksKeys(t, get(t, srv.URL+JWKSPath))

	a, err := loader.Authority(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := Workload{Space: "team-a", Actor: "web", ActorUID: "uid-1"}
	token, expires, err := a.MintJWT(w, []string{"vault", "db"})
	if err != nil {
		t.Fatal(err)
	}
	if want := clk.Now().Truncate(time.Second).Add(DefaultJWTTTL); !expires.Equal(want) {
		t.Errorf("expires %s, want %s", expires, want)
	}
	parse := func(audience string) (*WorkloadClaims, error) {
		claims := &WorkloadClaims{}
		_, err := jwt.ParseWithClaims(token, claims, func(tok *jwt.Token) (any, error) {
			kid, _ := tok.Header["kid"].(string)
			if k, ok := keys[kid]; ok {
				return k, nil
			}
			return nil, fmt.Errorf("kid %q is not in the JWKS", kid)
		}, jwt.WithValidMethods([]string{"ES256"}), jwt.WithIssuer(testIssuer), jwt.WithAudience(audience),
			jwt.WithExpirationRequired(), jwt.WithTimeFunc(clk.Now))
		return claims, err
	}
	claims, err := parse("db")
	if err != nil {
		t.Fatalf("verify with the JWKS: %v", err)
	}
	if claims.Subject != "spiffe://torpor.local/space/team-a/actor/web" || claims.ActorUID != "uid-1" || claims.ID == "" {
		t.Errorf("claims = %+v", claims)
	}
	if !claims.ExpiresAt.Time.Equal(expires) {
		t.Errorf("exp %s, response says %s", claims.ExpiresAt.Time, expires)
	}
	if _, err := parse("someone-else"); !errors.Is(err, jwt.ErrTokenInvalidAudience) {
		t.Errorf("other audience: err = %v, want invalid audience", err)
	}
	clk.Advance(DefaultJWTTTL + time.Second)
	if _, err := parse("db"); !errors.Is(err, jwt.ErrTokenExpired) {
		t.Errorf("after its lifetime: err = %v, want expired", err)
	}
}

func TestJWTAudienceChecked(t *testing.T) {
	a, _ := newAuthority(t, "sqlite")
	cases := []struct {
		name     string
		audience []string
		field    string
	}{
		{"none", nil, "audience"},
		{"empty entry", []string{"ok", ""}, "audience[1]"},
		{"too long", []string{strings.Repeat("a", maxAudienceBytes+1)}, "audience[0]"},
		{"too many", make([]string, maxAudiences+1), "audience"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := a.MintJWT(Workload{"s", "a", "u"}, tc.audience)
			var fe *validate.FieldError
			if !errors.As(err, &fe) || fe.Path != tc.field {
				t.Errorf("err = %v, want a field error on %s", err, tc.field)
			}
		})
	}
}
