// Package store keeps Torpor's records. One interface, two backends with
// identical behaviour (SQLite and PostgreSQL); every update is a
// compare-and-set on (uid, version), and InTx lets one transaction change
// several records together (an actor and its worker: DESIGN invariant 1).
package store

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Errors every backend returns (wrapped, with the object named).
var (
	ErrNotFound      = errdefs.ErrNotFound
	ErrAlreadyExists = errdefs.ErrAlreadyExists
	// ErrConflict: the record's uid or version no longer matches the caller's.
	ErrConflict = errdefs.New(errdefs.ErrAborted, "version conflict")
)

// Every Store call, and every InTx, rides out a database that restarts or
// is briefly out of reach by trying again within a bounded time; what
// still fails for that reason is ErrUnavailable (transient.go).

// Object is a stored record: every resource message carries ObjectMeta.
type Object interface {
	proto.Message
	GetMetadata() *torporv1.ObjectMeta
}

// Filter narrows a list to records whose indexed field equals a value.
// Indexed fields per kind are listed in the Collection documentation of
// Tx.
type Filter map[string]string

// ListOptions pages through records in (space, name) order.
type ListOptions struct {
	// Space limits the list to one space; empty lists all.
	Space     string
	PageSize  int
	PageToken string
	Filter    Filter
}

// Collection is the typed access to one kind of record.
type Collection[T Object] interface {
	// Create assigns uid (unless set), version 1 and times, and stores the
	// record; ErrAlreadyExists if (space, name) is taken.
	Create(ctx context.Context, obj T) (T, error)
	// Get returns ErrNotFound if absent.
	Get(ctx context.Context, space, name string) (T, error)
	// List returns one page and the token of the next (empty at the end).
	List(ctx context.Context, opts ListOptions) ([]T, string, error)
	// Update writes obj if its metadata uid and version match the stored
	// record (ErrConflict otherwise), bumps the version and update time,
	// and returns the stored record.
	Update(ctx context.Context, obj T) (T, error)
	// Delete removes the record; a non-empty uid or non-zero version must
	// match (ErrConflict otherwise).
	Delete(ctx context.Context, space, name, uid string, version int64) error
}

// Event is one entry of an actor's history.
type Event struct {
	ActorUID    string
	Time        time.Time
	FromState   torporv1.ActorState
	ToState     torporv1.ActorState
	Reason      string
	OperationID string
	Worker      string
	Duration    time.Duration
}

// Tx is the set of collections, bound to a transaction inside InTx.
//
// Indexed filter fields: actors "state", "template" (the revision's name,
// "NAME@REV"), "worker" (namespace/name), "sandbox" (the E2B sandbox ID:
// the name of an actor with spec.sandbox, unique across spaces; "" for
// the others); workers "node", "pool", "actor"
// (actor uid, "" for free); snapshots "actor_uid", "node", "template_uid",
// "location"; snapshot tags "snapshot";
// templates "phase"; template revisions "phase", "template" (the template's
// name); nodes none.
type Tx interface {
	Spaces() Collection[*torporv1.Space]
	// Templates holds one record per template name: its metadata, and the
	// latest revision's number in status.latest_revision.
	Templates() Collection[*torporv1.Template]
	// Revisions holds the immutable revisions of templates, each named
	// "NAME@REV" (validate.RevisionName) with its own uid, spec and status.
	Revisions() Collection[*torporv1.Template]
	Actors() Collection[*torporv1.Actor]
	Workers() Collection[*torporv1.Worker]
	Snapshots() Collection[*torporv1.Snapshot]
	// Tags names snapshots, per space (SnapshotTag).
	Tags() Collection[*torporv1.SnapshotTag]
	Nodes() Collection[*torporv1.Node]
	// AppendEvent records one actor history entry.
	AppendEvent(ctx context.Context, ev Event) error
	// Events returns an actor's history, oldest first.
	Events(ctx context.Context, actorUID string, limit int) ([]Event, error)
}

// Secrets keeps small values by name that every replica shares (the
// identity CA and signing keys, hashed join tokens). They are stored as
// given: not encrypted at rest.
type Secrets interface {
	// GetOrCreateSecret returns the stored secret, or stores what create
	// makes when there is none. Concurrent callers on any replica all get
	// the one value stored first.
	GetOrCreateSecret(ctx context.Context, name string, create func() ([]byte, error)) ([]byte, error)
	// GetSecret returns ErrNotFound if absent.
	GetSecret(ctx context.Context, name string) ([]byte, error)
	// DeleteSecret returns ErrNotFound if absent: of concurrent deletes of
	// one secret exactly one succeeds.
	DeleteSecret(ctx context.Context, name string) error
	// ListSecrets returns the secrets whose names start with prefix, by
	// name.
	ListSecrets(ctx context.Context, prefix string) ([]Secret, error)
}

// Secret is one stored secret. It is an alias of an unnamed struct so that
// identity.Secret, spelled the same, is the same type: the store then
// satisfies identity.Secrets without identity importing the store.
type Secret = struct {
	Name       string
	Data       []byte
	CreateTime time.Time
}

// Store is a Tx outside any transaction, plus transactions and secrets.
type Store interface {
	Tx
	Secrets
	ActivityLog
	ChangeFeed
	// InTx runs fn in one transaction: all of its writes commit together,
	// or none do when fn returns an error. fn runs again from the start
	// when the transaction fails transiently, so it must set whatever it
	// hands out of the transaction afresh on every run, and must not
	// change values it captured (a record it then writes again).
	InTx(ctx context.Context, fn func(tx Tx) error) error
	Close() error
}
