package identity

// API clients with certificates. A client joins with a client join token
// (Join) and gets a certificate naming spiffe://<trust-domain>/client/<name>
// with the client's UID in the subject's serialNumber. What the client may
// do is not in the certificate: it is the client's record in the store,
// read on every call (AuthenticateClient), so deleting the record revokes
// every certificate of the client at once, and a client joined again under
// the same name (a new UID) does not inherit the old one's certificates.

import (
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/validate"
)

// Role is what a client may do.
type Role string

const (
	// RoleAdmin may do what the admin token may.
	RoleAdmin Role = "admin"
	// RoleRouter may get, resume, suspend and pause the actors of its
	// spaces (every space when it lists none).
	RoleRouter Role = "router"
	// RoleUser may use templates, actors and snapshots of its spaces, as
	// an API token may.
	RoleUser Role = "user"
)

// Roles are the roles, in the order help texts list them.
var Roles = []Role{RoleAdmin, RoleRouter, RoleUser}

const clientSecretPrefix = "identity/client/"

// ErrUnknownClient wraps the refusal of a client certificate whose client
// was deleted or joined again since.
var ErrUnknownClient = errors.New("unknown client")

// Client is an API client that joined.
type Client struct {
	Name    string    `json:"name"`
	UID     string    `json:"uid"`
	Role    Role      `json:"role"`
	Spaces  []string  `json:"spaces,omitempty"`
	Created time.Time `json:"created"`
	// Pod, for a client that joined with its Kubernetes pod's token, is
	// that pod (NAMESPACE/NAME/UID): the client goes when the pod does.
	Pod string `json:"pod,omitempty"`
}

// checkRole checks that role is one and that spaces suit it.
func checkRole(role Role, spaces []string) error {
	switch role {
	case RoleAdmin:
		if len(spaces) > 0 {
			return &validate.FieldError{Path: "spaces", Reason: "an admin has access to every space: list none"}
		}
	case RoleRouter:
	case RoleUser:
		if len(spaces) == 0 {
			return &validate.FieldError{Path: "spaces", Reason: "a user client needs at least one space"}
		}
	default:
		return &validate.FieldError{Path: "role", Reason: fmt.Sprintf("%q is not a role (%s)", role, joinRoles())}
	}
	return nil
}

func joinRoles() string {
	names := make([]string, len(Roles))
	for i, r := range Roles {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}

// ClientID is the SPIFFE ID of API client name.
func ClientID(trustDomain, name string) string {
	return spiffeURL(trustDomain, "client", name).String()
}

// ClientFromCertificate returns the client and UID a client certificate
// of trustDomain names.
func ClientFromCertificate(cert *x509.Certificate, trustDomain string) (name, uid string, ok bool) {
	seg, ok := spiffeID(cert, trustDomain)
	if !ok || len(seg) != 2 || seg[0] != "client" || validate.Name("client", seg[1]) != nil || cert.Subject.SerialNumber == "" {
		return "", "", false
	}
	return seg[1], cert.Subject.SerialNumber, true
}

// replaceClient records a new client name (a new UID), replacing any
// client of that name. Of concurrent joins of one name, the first to
// store its record wins and the others fail.
func (a *Authority) replaceClient(ctx context.Context, c Client) (Client, error) {
	name := c.Name
	c.UID, c.Created = uuid.NewString(), a.cfg.Now().UTC()
	data, err := json.Marshal(c)
	if err != nil {
		return Client{}, err
	}
	if err := a.secrets.DeleteSecret(ctx, clientSecretPrefix+name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return Client{}, fmt.Errorf("replace client %s: %w", name, err)
	}
	stored, err := a.secrets.GetOrCreateSecret(ctx, clientSecretPrefix+name, func() ([]byte, error) { return data, nil })
	if err != nil {
		return Client{}, fmt.Errorf("record client %s: %w", name, err)
	}
	if string(stored) != string(data) {
		return Client{}, fmt.Errorf("%w: a concurrent join of client %s won", ErrInvalidToken, name)
	}
	return c, nil
}

// JoinPodClient records client name with role (every space) for a
// caller that proved to be Kubernetes pod (NAMESPACE/NAME/UID) by its
// ServiceAccount token, replacing any client of that name, and issues
// its certificate for csr.
func (a *Authority) JoinPodClient(ctx context.Context, name string, role Role, pod string, csr []byte) (*Issued, error) {
	if err := validate.Name("name", name); err != nil {
		return nil, err
	}
	pub, err := csrKey(csr)
	if err != nil {
		return nil, err
	}
	c, err := a.replaceClient(ctx, Client{Name: name, Role: role, Pod: pod})
	if err != nil {
		return nil, err
	}
	return a.issueClient(c, pub)
}

// AuthenticateClient returns the client a verified client certificate
// (name, uid) belongs to, read from the secrets.
func (a *Authority) AuthenticateClient(ctx context.Context, name, uid string) (Client, error) {
	c, err := a.client(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return Client{}, fmt.Errorf("%w: client %s was deleted", ErrUnknownClient, name)
	}
	if err != nil {
		return Client{}, err
	}
	if c.UID != uid {
		return Client{}, fmt.Errorf("%w: client %s joined again since (uid %s, the certificate's is %s)", ErrUnknownClient, name, c.UID, uid)
	}
	return c, nil
}

func (a *Authority) client(ctx context.Context, name string) (Client, error) {
	data, err := a.secrets.GetSecret(ctx, clientSecretPrefix+name)
	if err != nil {
		return Client{}, err
	}
	var c Client
	if err := json.Unmarshal(data, &c); err != nil {
		return Client{}, fmt.Errorf("client record %s: %w", name, err)
	}
	return c, nil
}

// RenewClient issues client name (with uid) a new certificate for the key
// of csr, if the client still is what its current certificate says.
func (a *Authority) RenewClient(ctx context.Context, name, uid string, csr []byte) (*Issued, error) {
	pub, err := csrKey(csr)
	if err != nil {
		return nil, err
	}
	c, err := a.AuthenticateClient(ctx, name, uid)
	if err != nil {
		return nil, err
	}
	return a.issueClient(c, pub)
}

// ListClients returns the clients, by name.
func (a *Authority) ListClients(ctx context.Context) ([]Client, error) {
	secrets, err := a.secrets.ListSecrets(ctx, clientSecretPrefix)
	if err != nil {
		return nil, fmt.Errorf("list clients: %w", err)
	}
	out := make([]Client, 0, len(secrets))
	for _, s := range secrets {
		var c Client
		if err := json.Unmarshal(s.Data, &c); err != nil {
			return nil, fmt.Errorf("client record %s: %w", s.Name, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// DeleteClient removes client name: its certificates stop working with
// the next call. errdefs.ErrNotFound if there is none.
func (a *Authority) DeleteClient(ctx context.Context, name string) error {
	if err := validate.Name("name", name); err != nil {
		return err
	}
	if err := a.secrets.DeleteSecret(ctx, clientSecretPrefix+name); err != nil {
		return fmt.Errorf("client %s: %w", name, err)
	}
	return nil
}

func (a *Authority) issueClient(c Client, pub crypto.PublicKey) (*Issued, error) {
	return a.issue(pub, &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{"torpor"}, CommonName: c.Name, SerialNumber: c.UID},
		URIs:        []*url.URL{spiffeURL(a.cfg.TrustDomain, "client", c.Name)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, a.cfg.MemberCertTTL)
}
