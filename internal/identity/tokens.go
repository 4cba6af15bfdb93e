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

	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// TokenPurpose says what a token is good for.
type TokenPurpose string

const (
	// PurposeNodeJoin joins one node, once (JoinNode).
	PurposeNodeJoin TokenPurpose = "node-join"
	// PurposeAPI authenticates an API client to some spaces until it
	// expires (AuthenticateAPIToken).
	PurposeAPI TokenPurpose = "api"
)

// Token lifetimes.
const (
	DefaultNodeJoinTokenTTL = time.Hour
	DefaultAPITokenTTL      = 24 * time.Hour
	MaxTokenTTL             = 365 * 24 * time.Hour
)

const (
	tokenPrefix       = "torpor-"
	tokenSecretPrefix = "identity/token/"
)

// ErrInvalidToken wraps every refusal of a token, with the reason (for the
// log; callers should hear only that the token was not accepted).
var ErrInvalidToken = errors.New("invalid token")

// TokenRequest describes a token to create.
type TokenRequest struct {
	Purpose TokenPurpose
	// Node (PurposeNodeJoin) is the only node name the token joins; empty
	// joins any.
	Node string
	// Spaces (PurposeAPI) the token gives access to.
	Spaces []string
	// TTL is the lifetime; zero takes the purpose's default.
	TTL time.Duration
}

// Token is a created token. Secret is shown once: only its hash is kept.
type Token struct {
	Secret  string
	Expires time.Time
}

// tokenRecord is what the secrets keep under the token's hash.
type tokenRecord struct {
	Purpose TokenPurpose `json:"purpose"`
	Node    string       `json:"node,omitempty"`
	Spaces  []string     `json:"spaces,omitempty"`
	Expires time.Time    `json:"expires"`
}

// CreateToken makes a token and stores its hash.
func (a *Authority) CreateToken(ctx context.Context, req TokenRequest) (Token, error) {
	rec := tokenRecord{Purpose: req.Purpose}
	ttl := req.TTL
	switch req.Purpose {
	case PurposeNodeJoin:
		if req.Node != "" {
			if err := validate.Name("node", req.Node); err != nil {
				return Token{}, err
			}
		}
		if len(req.Spaces) > 0 {
			return Token{}, &validate.FieldError{Path: "spaces", Reason: "a node join token gives no access to spaces"}
		}
		rec.Node = req.Node
		ttl = cmp.Or(ttl, DefaultNodeJoinTokenTTL)
	case PurposeAPI:
		if req.Node != "" {
			return Token{}, &validate.FieldError{Path: "node", Reason: "only a node join token names a node"}
		}
		if len(req.Spaces) == 0 {
			return Token{}, &validate.FieldError{Path: "spaces", Reason: "an API token needs at least one space"}
		}
		for i, s := range req.Spaces {
			if err := validate.Name(fmt.Sprintf("spaces[%d]", i), s); err != nil {
				return Token{}, err
			}
		}
		rec.Spaces = slices.Compact(slices.Sorted(slices.Values(req.Spaces)))
		ttl = cmp.Or(ttl, DefaultAPITokenTTL)
	default:
		return Token{}, &validate.FieldError{Path: "purpose", Reason: fmt.Sprintf("%q is not a token purpose (%s or %s)", req.Purpose, PurposeNodeJoin, PurposeAPI)}
	}
	if ttl < 0 || ttl > MaxTokenTTL {
		return Token{}, &validate.FieldError{Path: "ttl", Reason: fmt.Sprintf("%s is outside (0, %s]", ttl, MaxTokenTTL)}
	}
	rec.Expires = a.cfg.Now().Add(ttl).UTC()
	data, err := json.Marshal(rec)
	if err != nil {
		return Token{}, err
	}
	raw := make([]byte, 32)
	rand.Read(raw)
	secret := tokenPrefix + base64.RawURLEncoding.EncodeToString(raw)
	stored, err := a.secrets.GetOrCreateSecret(ctx, tokenSecretName(secret), func() ([]byte, error) { return data, nil })
	if err != nil {
		return Token{}, fmt.Errorf("store token: %w", err)
	}
	if string(stored) != string(data) {
		return Token{}, errors.New("store token: a token with the same hash exists (the random source is broken)")
	}
	return Token{Secret: secret, Expires: rec.Expires}, nil
}

// tokenSecretName keys a token by its SHA-256: the token has 256 random
// bits, so an unsalted hash is as good as a slow one and can be looked up.
func tokenSecretName(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return tokenSecretPrefix + hex.EncodeToString(sum[:])
}

// lookupToken returns the live record of a token of purpose.
func (a *Authority) lookupToken(ctx context.Context, secret string, purpose TokenPurpose) (tokenRecord, error) {
	if !strings.HasPrefix(secret, tokenPrefix) {
		return tokenRecord{}, fmt.Errorf("%w: not a torpor token", ErrInvalidToken)
	}
	name := tokenSecretName(secret)
	data, err := a.secrets.GetSecret(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return tokenRecord{}, fmt.Errorf("%w: unknown, or already used", ErrInvalidToken)
	}
	if err != nil {
		return tokenRecord{}, fmt.Errorf("look up token: %w", err)
	}
	var rec tokenRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return tokenRecord{}, fmt.Errorf("token record %s: %w", name, err)
	}
	if rec.Purpose != purpose {
		return tokenRecord{}, fmt.Errorf("%w: its purpose is %s, not %s", ErrInvalidToken, rec.Purpose, purpose)
	}
	if !a.cfg.Now().Before(rec.Expires) {
		// Expired tokens are removed when presented.
		if err := a.secrets.DeleteSecret(ctx, name); err != nil && !errors.Is(err, store.ErrNotFound) {
			return tokenRecord{}, fmt.Errorf("remove expired token: %w", err)
		}
		return tokenRecord{}, fmt.Errorf("%w: expired at %s", ErrInvalidToken, rec.Expires.Format(time.RFC3339))
	}
	return rec, nil
}

// JoinNode spends a node join token on the first certificate of node. The
// request is checked before the token is spent, so a malformed one does
// not waste it; of concurrent joins with one token, one succeeds.
func (a *Authority) JoinNode(ctx context.Context, secret, node string, csr []byte) (*Issued, error) {
	if err := validate.Name("node", node); err != nil {
		return nil, err
	}
	pub, err := csrKey(csr)
	if err != nil {
		return nil, err
	}
	rec, err := a.lookupToken(ctx, secret, PurposeNodeJoin)
	if err != nil {
		return nil, err
	}
	if rec.Node != "" && rec.Node != node {
		return nil, fmt.Errorf("%w: made for node %s, not %s", ErrInvalidToken, rec.Node, node)
	}
	if err := a.secrets.DeleteSecret(ctx, tokenSecretName(secret)); errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: used by a concurrent join", ErrInvalidToken)
	} else if err != nil {
		return nil, fmt.Errorf("spend token: %w", err)
	}
	return a.issueNode(node, pub)
}

// AuthenticateAPIToken returns the spaces an API token gives access to.
func (a *Authority) AuthenticateAPIToken(ctx context.Context, secret string) ([]string, error) {
	rec, err := a.lookupToken(ctx, secret, PurposeAPI)
	if err != nil {
		return nil, err
	}
	return rec.Spaces, nil
}
