package e2b

import (
	"context"
	"crypto/sha256"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
)

// spaceTTL is how long the gateway remembers a key's space. Only the
// space's name is remembered: every call still presents the key, and the
// server's gate checks it each time, so a revoked key is refused at once.
const spaceTTL = time.Minute

// maxRememberedKeys bounds the memory of keys' spaces.
const maxRememberedKeys = 4096

// keySpaces learns the space an E2B key is of from the server: ListSpaces
// answers a space-scoped token with the spaces it gives access to, and an
// E2B key gives access to exactly one.
type keySpaces struct {
	spaces torporv1connect.SpaceServiceClient
	now    func() time.Time

	mu    sync.Mutex
	known map[[sha256.Size]byte]rememberedSpace
}

type rememberedSpace struct {
	space   string
	expires time.Time
}

// of returns the space of key.
func (k *keySpaces) of(ctx context.Context, key string) (string, error) {
	sum := sha256.Sum256([]byte(key))
	now := k.now()
	k.mu.Lock()
	r, ok := k.known[sum]
	k.mu.Unlock()
	if ok && now.Before(r.expires) {
		return r.space, nil
	}
	resp, err := k.spaces.ListSpaces(ctx, withKey(&torporv1.ListRequest{}, key))
	if err != nil {
		return "", statusOf(err, "")
	}
	spaces := resp.Msg.GetSpaces()
	switch {
	case len(spaces) == 0:
		return "", &apiError{status: http.StatusForbidden, message: "X-API-KEY: the key gives access to no space"}
	case len(spaces) > 1 || resp.Msg.GetNextPageToken() != "":
		return "", &apiError{status: http.StatusForbidden, message: "X-API-KEY: the credential gives access to several spaces; an E2B key is of exactly one"}
	}
	space := spaces[0].GetMetadata().GetName()
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.known) >= maxRememberedKeys {
		for s, r := range k.known {
			if !now.Before(r.expires) {
				delete(k.known, s)
			}
		}
		if len(k.known) >= maxRememberedKeys {
			clear(k.known)
		}
	}
	k.known[sum] = rememberedSpace{space: space, expires: now.Add(spaceTTL)}
	return space, nil
}

// forget drops what is remembered of key (the server refused it).
func (k *keySpaces) forget(key string) {
	sum := sha256.Sum256([]byte(key))
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.known, sum)
}

// withKey is a connect request of msg that presents the caller's E2B key
// as the bearer token the server's gate checks.
func withKey[T any](msg *T, key string) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set("Authorization", "Bearer "+key)
	return req
}
