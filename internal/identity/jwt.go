package identity

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"

	"github.com/torpor-dev/torpor/internal/validate"
)

// Well-known paths WellKnown serves, relative to the issuer URL.
const (
	JWKSPath      = "/.well-known/jwks.json"
	DiscoveryPath = "/.well-known/openid-configuration"
)

// Limits on a JWT's audience.
const (
	maxAudiences     = 16
	maxAudienceBytes = 256
)

// WorkloadClaims are the claims of a workload JWT.
type WorkloadClaims struct {
	jwt.RegisteredClaims
	// ActorUID tells this incarnation of the actor (sub names the actor).
	ActorUID string `json:"actor_uid"`
}

// jwtSigner signs with one key, published with its RFC 7638 thumbprint as
// the kid; the JWKS and discovery documents are made once.
type jwtSigner struct {
	key       *ecdsa.PrivateKey
	kid       string
	issuer    string
	jwks      []byte
	discovery []byte
}

func newJWTSigner(key *ecdsa.PrivateKey, issuer string) (*jwtSigner, error) {
	raw, err := key.PublicKey.Bytes() // 0x04 || X || Y
	if err != nil {
		return nil, fmt.Errorf("identity: JWT signing key: %w", err)
	}
	x := base64.RawURLEncoding.EncodeToString(raw[1:33])
	y := base64.RawURLEncoding.EncodeToString(raw[33:])
	// RFC 7638: the required members, in lexical order, no whitespace.
	thumb := sha256.Sum256([]byte(`{"crv":"P-256","kty":"EC","x":"` + x + `","y":"` + y + `"}`))
	kid := base64.RawURLEncoding.EncodeToString(thumb[:])
	jwks, err := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "EC", "crv": "P-256", "x": x, "y": y, "kid": kid, "use": "sig", "alg": "ES256",
	}}})
	if err != nil {
		return nil, err
	}
	discovery, err := json.Marshal(map[string]any{
		"issuer":                                issuer,
		"jwks_uri":                              strings.TrimSuffix(issuer, "/") + JWKSPath,
		"id_token_signing_alg_values_supported": []string{"ES256"},
		"response_types_supported":              []string{"id_token"},
		"subject_types_supported":               []string{"public"},
	})
	if err != nil {
		return nil, err
	}
	return &jwtSigner{key: key, kid: kid, issuer: issuer, jwks: jwks, discovery: discovery}, nil
}

// MintJWT signs a short-lived ES256 token for actor w: iss is the
// configured issuer, sub the actor's SPIFFE ID, aud the given audience.
// Only call it for a workload AuthorizeWorkload granted.
func (a *Authority) MintJWT(w Workload, audience []string) (token string, expires time.Time, err error) {
	if a.jwt.issuer == "" {
		return "", time.Time{}, errors.New("identity: no issuer URL is configured: cannot mint JWTs")
	}
	if err := checkAudience(audience); err != nil {
		return "", time.Time{}, err
	}
	now := a.cfg.Now().Truncate(time.Second)
	expires = now.Add(a.cfg.JWTTTL)
	claims := WorkloadClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    a.jwt.issuer,
			Subject:   ActorID(a.cfg.TrustDomain, w.Space, w.Actor),
			Audience:  audience,
			ExpiresAt: jwt.NewNumericDate(expires),
			NotBefore: jwt.NewNumericDate(now.Add(-backdate)),
			IssuedAt:  jwt.NewNumericDate(now),
			ID:        uuid.NewString(),
		},
		ActorUID: w.ActorUID,
	}
	t := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
	t.Header["kid"] = a.jwt.kid
	token, err = t.SignedString(a.jwt.key)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("sign JWT for %s: %w", claims.Subject, err)
	}
	return token, expires, nil
}

func checkAudience(audience []string) error {
	if len(audience) == 0 {
		return &validate.FieldError{Path: "audience", Reason: "at least one is required"}
	}
	if len(audience) > maxAudiences {
		return &validate.FieldError{Path: "audience", Reason: fmt.Sprintf("more than %d entries", maxAudiences)}
	}
	for i, aud := range audience {
		if aud == "" || len(aud) > maxAudienceBytes {
			return &validate.FieldError{Path: fmt.Sprintf("audience[%d]", i), Reason: fmt.Sprintf("must be 1 to %d bytes", maxAudienceBytes)}
		}
	}
	return nil
}

// JWKS is the JSON Web Key Set verifiers check workload JWTs with.
func (a *Authority) JWKS() []byte { return a.jwt.jwks }

// WellKnown serves the JWKS (JWKSPath) and a minimal OpenID discovery
// document (DiscoveryPath) naming it, loading the keys on first use (a
// failure is logged and answered 503).
func (l *Loader) WellKnown(log *slog.Logger) http.Handler {
	serve := func(doc func(*jwtSigner) []byte) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			a, err := l.Authority(r.Context())
			if err != nil {
				log.Error("serve identity documents", "path", r.URL.Path, "err", err)
				http.Error(w, "identity keys are unavailable, retry", http.StatusServiceUnavailable)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "max-age=300")
			w.Write(doc(a.jwt))
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+JWKSPath, serve(func(s *jwtSigner) []byte { return s.jwks }))
	mux.Handle("GET "+DiscoveryPath, serve(func(s *jwtSigner) []byte { return s.discovery }))
	return mux
}
