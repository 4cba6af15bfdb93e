package identity

import (
	"context"
	"time"
)

// Secrets keeps the CA, the signing key, join tokens and API clients by
// name, shared by every replica of the control plane; store.Store is one.
// Absent names are errdefs.ErrNotFound.
type Secrets interface {
	// GetOrCreateSecret returns the stored secret, or stores what create
	// makes when there is none: concurrent callers on any replica all get
	// the one value stored first.
	GetOrCreateSecret(ctx context.Context, name string, create func() ([]byte, error)) ([]byte, error)
	GetSecret(ctx context.Context, name string) ([]byte, error)
	// DeleteSecret succeeds for exactly one of concurrent deletes of a
	// name, which makes a join token usable once.
	DeleteSecret(ctx context.Context, name string) error
	// ListSecrets returns the secrets whose names start with prefix, by
	// name.
	ListSecrets(ctx context.Context, prefix string) ([]Secret, error)
}

// Secret is one stored secret. It is an alias of an unnamed struct, as
// store.Secret is, so the two are one type and the store satisfies
// Secrets.
type Secret = struct {
	Name       string
	Data       []byte
	CreateTime time.Time
}
