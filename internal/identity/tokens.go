package identity

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/validate"
)

// TokenPurpose says what a token is good for.
type TokenPurpose string

const (
	// PurposeNodeJoin joins one node, once (Join).
	PurposeNodeJoin TokenPurpose = "node-join"
	// PurposeClientJoin joins one API client with a role, once (Join).
	PurposeClientJoin TokenPurpose = "client-join"
	// PurposeAPI authenticates an API client to some spaces until it
	// expires (AuthenticateAPIToken).
	PurposeAPI TokenPurpose = "api"
	// PurposeE2B is an E2B API key: an API token of exactly one space,
	// shaped like the keys the E2B SDK expects (e2b_ and 64 hex digits),
	// which the E2B-compatible API forwards as the caller's credential.
	PurposeE2B TokenPurpose = "e2b"
)

// Token lifetimes.
const (
	DefaultJoinTokenTTL = time.Hour
	DefaultAPITokenTTL  = 24 * time.Hour
	MaxTokenTTL         = 365 * 24 * time.Hour
	// DefaultE2BKeyTTL: E2B keys are configured once into SDK clients,
	// like the keys E2B issues, so they last as long as a token may.
	DefaultE2BKeyTTL = MaxTokenTTL
)

const (
	tokenPrefix = "torpor-"
	// e2bKeyPrefix starts an E2B key; 32 random bytes in lower-case hex
	// follow.
	e2bKeyPrefix      = "e2b_"
	tokenSecretPrefix = "identity/token/"
	// minTokenIDPrefix is the shortest id prefix RevokeToken accepts.
	minTokenIDPrefix = 8
)

// ErrInvalidToken wraps every refusal of a token, with the reason (for the
// log; callers should hear only that the token was not accepted).
var ErrInvalidToken = errors.New("invalid token")

// TokenRequest describes a token to create.
type TokenRequest struct {
	Purpose TokenPurpose
	// Name (join tokens) is the only member name the token joins; empty
	// joins any.
	Name string
	// Spaces the token (PurposeAPI; exactly one for PurposeE2B) or the
	// client (PurposeClientJoin) has access to.
	Spaces []string
	// Role (PurposeClientJoin) of the client.
	Role Role
	// TTL is the lifetime; zero takes the purpose's default.
	TTL time.Duration
}

// Token is a created token. Secret is shown once: only its hash, which is
// its ID, is kept.
type Token struct {
	ID      string
	Secret  string
	Expires time.Time
}

// TokenInfo is what is kept about a token.
type TokenInfo struct {
	ID      string
	Purpose TokenPurpose
	Name    string
	Spaces  []string
	Role    Role
	Created time.Time
	Expires time.Time
}

// tokenRecord is what the secrets keep under the token's hash.
type tokenRecord struct {
	Purpose TokenPurpose `json:"purpose"`
	Name    string       `json:"name,omitempty"`
	Spaces  []string     `json:"spaces,omitempty"`
	Role    Role         `json:"role,omitempty"`
	Expires time.Time    `json:"expires"`
}

// CreateToken makes a token and stores its hash.
func (a *Authority) CreateToken(ctx context.Context, req TokenRequest) (Token, error) {
	rec := tokenRecord{Purpose: req.Purpose, Name: req.Name, Role: req.Role}
	ttl := req.TTL
	if req.Purpose != PurposeClientJoin && req.Role != "" {
		return Token{}, &validate.FieldError{Path: "role", Reason: "only a client join token gives a role"}
	}
	switch req.Purpose {
	case PurposeNodeJoin, PurposeClientJoin:
		if req.Name != "" {
			if err := validate.Name("name", req.Name); err != nil {
				return Token{}, err
			}
		}
		if req.Purpose == PurposeNodeJoin && len(req.Spaces) > 0 {
			return Token{}, &validate.FieldError{Path: "spaces", Reason: "a node join token gives no access to spaces"}
		}
		ttl = cmp.Or(ttl, DefaultJoinTokenTTL)
	case PurposeAPI:
		if req.Name != "" {
			return Token{}, &validate.FieldError{Path: "name", Reason: "only a join token names a member"}
		}
		if len(req.Spaces) == 0 {
			return Token{}, &validate.FieldError{Path: "spaces", Reason: "an API token needs at least one space"}
		}
		ttl = cmp.Or(ttl, DefaultAPITokenTTL)
	case PurposeE2B:
		if req.Name != "" {
			return Token{}, &validate.FieldError{Path: "name", Reason: "only a join token names a member"}
		}
		ttl = cmp.Or(ttl, DefaultE2BKeyTTL)
	default:
		return Token{}, &validate.FieldError{Path: "purpose", Reason: fmt.Sprintf("%q is not a token purpose (%s, %s, %s or %s)", req.Purpose, PurposeNodeJoin, PurposeClientJoin, PurposeAPI, PurposeE2B)}
	}
	spaces, err := checkSpaces(req.Spaces)
	if err != nil {
		return Token{}, err
	}
	rec.Spaces = spaces
	// One space: the E2B API has no notion of spaces, so the key alone
	// says which one its sandboxes are in.
	if req.Purpose == PurposeE2B && len(spaces) != 1 {
		return Token{}, &validate.FieldError{Path: "spaces", Reason: fmt.Sprintf("an E2B key is for exactly one space, not %d", len(spaces))}
	}
	if req.Purpose == PurposeClientJoin {
		if err := checkRole(req.Role, spaces); err != nil {
			return Token{}, err
		}
	}
	if ttl < 0 || ttl > MaxTokenTTL {
		return Token{}, &validate.FieldError{Path: "ttl", Reason: fmt.Sprintf("%s is outside (0, %s]", ttl, MaxTokenTTL)}
	}
	rec.Expires = a.cfg.Now().Add(ttl).UTC()
	data, err := json.Marshal(rec)
	if err != nil {
		return Token{}, err
	}
	secret := newTokenSecret(req.Purpose)
	stored, err := a.secrets.GetOrCreateSecret(ctx, tokenSecretName(secret), func() ([]byte, error) { return data, nil })
	if err != nil {
		return Token{}, fmt.Errorf("store token: %w", err)
	}
	if string(stored) != string(data) {
		return Token{}, errors.New("store token: a token with the same hash exists (the random source is broken)")
	}
	return Token{ID: tokenID(secret), Secret: secret, Expires: rec.Expires}, nil
}

// newTokenSecret returns a new token of purpose: 256 random bits, in the
// shape of an E2B key for PurposeE2B.
func newTokenSecret(purpose TokenPurpose) string {
	raw := make([]byte, 32)
	rand.Read(raw)
	if purpose == PurposeE2B {
		return e2bKeyPrefix + hex.EncodeToString(raw)
	}
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(raw)
}

// checkSpaces validates space names and returns them sorted, without
// repeats.
func checkSpaces(spaces []string) ([]string, error) {
	for i, s := range spaces {
		if err := validate.Name(fmt.Sprintf("spaces[%d]", i), s); err != nil {
			return nil, err
		}
	}
	if len(spaces) == 0 {
		return nil, nil
	}
	return slices.Compact(slices.Sorted(slices.Values(spaces))), nil
}

// ListTokens returns the tokens that can still be used, by ID; expired
// ones are removed on the way.
func (a *Authority) ListTokens(ctx context.Context) ([]TokenInfo, error) {
	secrets, err := a.secrets.ListSecrets(ctx, tokenSecretPrefix)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	out := make([]TokenInfo, 0, len(secrets))
	for _, s := range secrets {
		info, err := tokenInfo(s)
		if err != nil {
			return nil, err
		}
		if !a.cfg.Now().Before(info.Expires) {
			if err := a.secrets.DeleteSecret(ctx, s.Name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return nil, fmt.Errorf("remove expired token %s: %w", info.ID, err)
			}
			continue
		}
		out = append(out, info)
	}
	return out, nil
}

// RevokeToken deletes the one token whose ID starts with idPrefix.
func (a *Authority) RevokeToken(ctx context.Context, idPrefix string) (TokenInfo, error) {
	if len(idPrefix) < minTokenIDPrefix {
		return TokenInfo{}, &validate.FieldError{Path: "id", Reason: fmt.Sprintf("give at least %d characters of the token's id (torpor token list)", minTokenIDPrefix)}
	}
	secrets, err := a.secrets.ListSecrets(ctx, tokenSecretPrefix+strings.ToLower(idPrefix))
	if err != nil {
		return TokenInfo{}, fmt.Errorf("revoke token %s: %w", idPrefix, err)
	}
	switch len(secrets) {
	case 0:
		return TokenInfo{}, fmt.Errorf("token %s: %w", idPrefix, errdefs.ErrNotFound)
	case 1:
	default:
		return TokenInfo{}, &validate.FieldError{Path: "id", Reason: fmt.Sprintf("%s is the start of %d tokens' ids: give more of it", idPrefix, len(secrets))}
	}
	info, err := tokenInfo(secrets[0])
	if err != nil {
		return TokenInfo{}, err
	}
	if err := a.secrets.DeleteSecret(ctx, secrets[0].Name); err != nil {
		return TokenInfo{}, fmt.Errorf("revoke token %s: %w", info.ID, err)
	}
	return info, nil
}

func tokenInfo(s Secret) (TokenInfo, error) {
	var rec tokenRecord
	if err := json.Unmarshal(s.Data, &rec); err != nil {
		return TokenInfo{}, fmt.Errorf("token record %s: %w", s.Name, err)
	}
	return TokenInfo{
		ID: strings.TrimPrefix(s.Name, tokenSecretPrefix), Purpose: rec.Purpose, Name: rec.Name,
		Spaces: rec.Spaces, Role: rec.Role, Created: s.CreateTime, Expires: rec.Expires,
	}, nil
}

// tokenID is a token's SHA-256: the token has 256 random bits, so an
// unsalted hash is as good as a slow one and can be looked up.
func tokenID(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func tokenSecretName(secret string) string { return tokenSecretPrefix + tokenID(secret) }

// lookupToken returns the live record of a token of one of purposes.
func (a *Authority) lookupToken(ctx context.Context, secret string, purposes ...TokenPurpose) (tokenRecord, error) {
	if !strings.HasPrefix(secret, tokenPrefix) && !strings.HasPrefix(secret, e2bKeyPrefix) {
		return tokenRecord{}, fmt.Errorf("%w: not a torpor token", ErrInvalidToken)
	}
	name := tokenSecretName(secret)
	data, err := a.secrets.GetSecret(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return tokenRecord{}, fmt.Errorf("%w: unknown, or already used", ErrInvalidToken)
	}
	if err != nil {
		return tokenRecord{}, fmt.Errorf("look up token: %w", err)
	}
	var rec tokenRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return tokenRecord{}, fmt.Errorf("token record %s: %w", name, err)
	}
	if !slices.Contains(purposes, rec.Purpose) {
		return tokenRecord{}, fmt.Errorf("%w: its purpose is %s, not %v", ErrInvalidToken, rec.Purpose, purposes)
	}
	if !a.cfg.Now().Before(rec.Expires) {
		// Expired tokens are removed when presented.
		if err := a.secrets.DeleteSecret(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return tokenRecord{}, fmt.Errorf("remove expired token: %w", err)
		}
		return tokenRecord{}, fmt.Errorf("%w: expired at %s", ErrInvalidToken, rec.Expires.Format(time.RFC3339))
	}
	return rec, nil
}

// Join spends a join token on the first certificate of member name: a
// node's for a node join token, a client's (recorded with the token's role
// and spaces, replacing any client of that name) for a client join token.
// The request is checked before the token is spent, so a malformed one
// does not waste it; of concurrent joins with one token, one succeeds.
func (a *Authority) Join(ctx context.Context, secret, name string, csr []byte) (*Issued, error) {
	if err := validate.Name("name", name); err != nil {
		return nil, err
	}
	pub, err := csrKey(csr)
	if err != nil {
		return nil, err
	}
	rec, err := a.lookupToken(ctx, secret, PurposeNodeJoin, PurposeClientJoin)
	if err != nil {
		return nil, err
	}
	if rec.Name != "" && rec.Name != name {
		return nil, fmt.Errorf("%w: made for %s, not %s", ErrInvalidToken, rec.Name, name)
	}
	if err := a.secrets.DeleteSecret(ctx, tokenSecretName(secret)); errors.Is(err, errdefs.ErrNotFound) {
		return nil, fmt.Errorf("%w: used by a concurrent join", ErrInvalidToken)
	} else if err != nil {
		return nil, fmt.Errorf("spend token: %w", err)
	}
	if rec.Purpose == PurposeNodeJoin {
		return a.issueNode(name, pub)
	}
	client, err := a.replaceClient(ctx, Client{Name: name, Role: rec.Role, Spaces: rec.Spaces})
	if err != nil {
		return nil, err
	}
	return a.issueClient(client, pub)
}

// AuthenticateAPIToken returns the spaces an API token gives access to.
// An E2B key is an API token of its one space.
func (a *Authority) AuthenticateAPIToken(ctx context.Context, secret string) ([]string, error) {
	rec, err := a.lookupToken(ctx, secret, PurposeAPI, PurposeE2B)
	if err != nil {
		return nil, err
	}
	return rec.Spaces, nil
}
