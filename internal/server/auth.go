package server

// API access. Every call presents a credential, checked here in one
// interceptor (gate) against one table (accessRules):
//
//   - the admin token, or the certificate of an admin client: everything
//     except what only a node may call;
//   - an API token (identity.PurposeAPI, or an E2B key, identity.PurposeE2B,
//     which is one of a single space), or the certificate of a user client:
//     templates, actors, sandboxes and snapshots of the spaces it names, and
//     nothing else (spaces, workers and nodes are administration);
//   - the certificate of a router client: getting, resuming, suspending
//     and pausing the actors of its spaces (of all, if it names none),
//     and reporting their activity;
//   - a node certificate: the calls a node agent makes for itself
//     (registration, heartbeats, its certificate, its workloads'
//     identities).
//
// Certificates are verified by the TLS layer (CallerMiddleware); a
// client's role and spaces are read from the store on every call, so a
// deleted client is refused at once. Tokens travel as "Authorization:
// Bearer <token>" and, when present, are the credential that counts. Join
// needs none: its join token is its credential. A call without a
// credential its rule accepts is Unauthenticated; an authenticated caller
// beyond its rights gets PermissionDenied.

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/atomicfile"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/store"
)

// access is who may make a call.
type access int

const (
	// accessPublic: anyone (JoinNode, whose join token is checked by the
	// call itself).
	accessPublic access = iota + 1
	// accessAdmin: the admin token.
	accessAdmin
	// accessSpace: the admin token, or an API token for the space the
	// request names.
	accessSpace
	// accessNode: a node certificate (the call itself checks which node
	// may do what).
	accessNode
	// accessMember: a node or client certificate (its own renewal).
	accessMember
	// accessOwnSpaces: the admin token, or an API token or client, which
	// sees the spaces it gives access to only (ListSpaces: what a tenant's
	// dashboard lists).
	accessOwnSpaces
	// accessRouter: the admin token, or a router client's certificate for
	// the actors of its spaces (ReportActivity, whose batch may name
	// several spaces: each is checked).
	accessRouter
)

// accessRules gives every procedure of the API its access. A procedure
// missing here is refused to everyone (TestEveryProcedureHasAnAccessRule
// keeps the table complete).
var accessRules = func() map[string]access {
	rules := map[string]access{
		torporv1connect.NodeServiceRegisterNodeProcedure:         accessNode,
		torporv1connect.NodeServiceHeartbeatProcedure:            accessNode,
		torporv1connect.NodeServiceReportExitProcedure:           accessNode,
		torporv1connect.NodeServiceReportEgressDeniedProcedure:   accessNode,
		torporv1connect.NodeServiceReportFrozenProcedure:         accessNode,
		torporv1connect.NodeServiceGetNodeProcedure:              accessAdmin,
		torporv1connect.NodeServiceListNodesProcedure:            accessAdmin,
		torporv1connect.IdentityServiceJoinProcedure:             accessPublic,
		torporv1connect.IdentityServiceRenewCertificateProcedure: accessMember,
		torporv1connect.IdentityServiceMintCertProcedure:         accessNode,
		torporv1connect.IdentityServiceMintJWTProcedure:          accessNode,
		torporv1connect.IdentityServiceCreateTokenProcedure:      accessAdmin,
		torporv1connect.IdentityServiceListTokensProcedure:       accessAdmin,
		torporv1connect.IdentityServiceRevokeTokenProcedure:      accessAdmin,
		torporv1connect.IdentityServiceListClientsProcedure:      accessAdmin,
		torporv1connect.IdentityServiceDeleteClientProcedure:     accessAdmin,
		// The call checks the domain; the router's spaces do not matter.
		torporv1connect.IdentityServiceIssueIngressCertificateProcedure: accessRouter,
	}
	byService := map[string]access{
		torporv1connect.SpaceServiceName:    accessAdmin,
		torporv1connect.WorkerServiceName:   accessAdmin,
		torporv1connect.TemplateServiceName: accessSpace,
		torporv1connect.ActorServiceName:    accessSpace,
		torporv1connect.SnapshotServiceName: accessSpace,
		torporv1connect.SandboxServiceName:  accessSpace,
	}
	for service, a := range byService {
		for _, m := range methods(service) {
			rules["/"+service+"/"+string(m.Name())] = a
		}
	}
	rules[torporv1connect.SpaceServiceListSpacesProcedure] = accessOwnSpaces
	rules[torporv1connect.ActorServiceReportActivityProcedure] = accessRouter
	rules[torporv1connect.PlacementServiceWatchPlacementsProcedure] = accessRouter
	rules[torporv1connect.PlacementServiceLookupSandboxProcedure] = accessRouter
	return rules
}()

// routerCalls are the calls a router client may make (accessSpace calls
// all of them).
var routerCalls = map[string]bool{
	torporv1connect.ActorServiceGetActorProcedure:     true,
	torporv1connect.ActorServiceResumeActorProcedure:  true,
	torporv1connect.ActorServiceSuspendActorProcedure: true,
	torporv1connect.ActorServicePauseActorProcedure:   true,
}

// methods are the methods of the named API service.
func methods(service string) []protoreflect.MethodDescriptor {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		panic(fmt.Sprintf("service %s: %v", service, err))
	}
	ms := d.(protoreflect.ServiceDescriptor).Methods()
	out := make([]protoreflect.MethodDescriptor, ms.Len())
	for i := range out {
		out[i] = ms.Get(i)
	}
	return out
}

// principal is what a call's credentials prove.
type principal struct {
	admin bool
	// spaces an API token or client gives access to.
	spaces []string
	// everySpace: a router client that names no spaces.
	everySpace bool
	// only, when set, are the only calls allowed (a router client's).
	only map[string]bool
	// node whose certificate the caller presented.
	node string
	// client whose certificate the caller presented (and that exists).
	client string
}

func (p principal) anonymous() bool {
	return !p.admin && p.spaces == nil && !p.everySpace && p.node == "" && p.client == ""
}

// gate authenticates and authorizes every call (connect.Interceptor).
type gate struct {
	identity *identity.Loader
	admin    *adminToken
	log      *slog.Logger
}

func (g *gate) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		p, err := g.checkAs(ctx, req.Spec().Procedure, req.Header(), req.Any())
		if err != nil {
			return nil, err
		}
		return next(withVisibleSpaces(ctx, p), req)
	}
}

// WrapStreamingHandler checks a stream before its first message, or,
// where the rule depends on the request's space, as its first message
// arrives: the handlers of such streams read it before anything else, so
// an unchecked caller neither sends nor receives a thing.
func (g *gate) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		procedure := conn.Spec().Procedure
		if accessRules[procedure] == accessSpace {
			return next(ctx, &checkFirst{StreamingHandlerConn: conn, check: func(msg any) error {
				return g.check(ctx, procedure, conn.RequestHeader(), msg)
			}})
		}
		p, err := g.checkAs(ctx, procedure, conn.RequestHeader(), nil)
		if err != nil {
			return err
		}
		return next(withVisibleSpaces(ctx, p), conn)
	}
}

// checkFirst is a stream whose first message must pass check before the
// handler sees it; a refusal is the answer to every further receive.
type checkFirst struct {
	connect.StreamingHandlerConn
	check   func(msg any) error
	checked bool
	refused error
}

func (c *checkFirst) Receive(msg any) error {
	if c.refused != nil {
		return c.refused
	}
	if err := c.StreamingHandlerConn.Receive(msg); err != nil || c.checked {
		return err
	}
	c.checked = true
	c.refused = c.check(msg)
	return c.refused
}

// Send refuses to answer a caller not checked yet.
func (c *checkFirst) Send(msg any) error {
	if !c.checked {
		return connect.NewError(connect.CodePermissionDenied, errors.New("the stream answered before its first request was checked"))
	}
	if c.refused != nil {
		return c.refused
	}
	return c.StreamingHandlerConn.Send(msg)
}

func (g *gate) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (g *gate) check(ctx context.Context, procedure string, header http.Header, msg any) error {
	_, err := g.checkAs(ctx, procedure, header, msg)
	return err
}

// visibleSpacesKey carries into a handler the spaces its caller may see,
// for calls that name no space (a router's placement watch, ListSpaces).
type visibleSpacesKey struct{}

func withVisibleSpaces(ctx context.Context, p principal) context.Context {
	var spaces []string // nil: every space
	if !p.admin && !p.everySpace {
		spaces = append([]string{}, p.spaces...)
	}
	return context.WithValue(ctx, visibleSpacesKey{}, spaces)
}

// visibleSpaces returns the spaces the stream's caller may see, nil for
// every space; ok is false outside a checked stream.
func visibleSpaces(ctx context.Context) (spaces []string, ok bool) {
	spaces, ok = ctx.Value(visibleSpacesKey{}).([]string)
	return spaces, ok
}

// checkAs checks a call and returns who makes it.
func (g *gate) checkAs(ctx context.Context, procedure string, header http.Header, msg any) (principal, error) {
	var p principal
	if err := g.decide(ctx, procedure, header, msg, &p); err != nil {
		return principal{}, err
	}
	return p, nil
}

func (g *gate) decide(ctx context.Context, procedure string, header http.Header, msg any, out *principal) error {
	rule, ok := accessRules[procedure]
	if !ok {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s has no access rule", procedure))
	}
	if rule == accessPublic {
		return nil
	}
	p, err := g.authenticate(ctx, header)
	if err != nil {
		return err
	}
	*out = p
	if rule == accessNode && p.node == "" {
		return connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%s needs a node certificate", procedure))
	}
	if rule == accessMember && p.node == "" && p.client == "" {
		return connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%s needs a node or client certificate", procedure))
	}
	if p.anonymous() {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("this call needs a credential: an API token (Authorization: Bearer <token>) or a client certificate"))
	}
	deny := func(format string, args ...any) error {
		err := fmt.Errorf(format, args...)
		g.log.WarnContext(ctx, "call refused", "procedure", procedure, "node", p.node, "client", p.client, "spaces", p.spaces, "reason", err)
		return connect.NewError(connect.CodePermissionDenied, err)
	}
	switch rule {
	case accessAdmin:
		if !p.admin {
			return deny("only an admin may call %s", procedure)
		}
	case accessSpace:
		if p.admin {
			return nil
		}
		if p.only != nil && !p.only[procedure] {
			return deny("a router may not call %s", procedure)
		}
		if p.everySpace {
			return nil
		}
		if p.spaces == nil {
			return deny("%s needs an API token", procedure)
		}
		space, named := requestSpace(msg)
		switch {
		case !named:
			return deny("%s: the request names no space the token could be checked against", procedure)
		case space == "":
			return deny("the token gives access to spaces %s only: name one (--space)", strings.Join(p.spaces, ", "))
		case !slices.Contains(p.spaces, space):
			return deny("the token gives no access to space %q", space)
		}
	case accessOwnSpaces:
		if !p.admin && p.spaces == nil {
			return deny("%s needs an API token", procedure)
		}
	case accessRouter:
		if p.admin {
			return nil
		}
		if p.only == nil {
			return deny("only a router may call %s", procedure)
		}
		if p.everySpace {
			return nil
		}
		for _, space := range reportedSpaces(msg) {
			if !slices.Contains(p.spaces, space) {
				return deny("the router serves spaces %s only, not %q", strings.Join(p.spaces, ", "), space)
			}
		}
	}
	return nil
}

// reportedSpaces are the spaces of the actors an activity report names.
func reportedSpaces(msg any) []string {
	r, _ := msg.(*torporv1.ReportActivityRequest)
	var spaces []string
	for _, a := range r.GetActors() {
		spaces = append(spaces, a.GetSpace())
	}
	return spaces
}

// authenticate reads the credentials of a call: a bearer token (refused
// when not valid), else a client certificate (refused when its client is
// gone), and the node certificate CallerMiddleware found.
func (g *gate) authenticate(ctx context.Context, header http.Header) (principal, error) {
	var p principal
	p.node, _ = identity.CallerNode(ctx)
	auth := header.Get("Authorization")
	client, clientUID, hasClient := identity.CallerClient(ctx)
	if auth == "" && !hasClient {
		return p, nil
	}
	// Classified as every answer is (errdefs.Code): a store out of reach is
	// Unavailable and worth a retry, anything else that is not the
	// caller's giving up is the control plane's fault. The caller learns
	// no detail; the log has it.
	cannotCheck := func(what string, err error) error {
		g.log.ErrorContext(ctx, what, "err", err)
		switch code := errdefs.Code(err); code {
		case connect.CodeUnavailable:
			return connect.NewError(code, errors.New("the control plane cannot check credentials now, retry"))
		case connect.CodeCanceled, connect.CodeDeadlineExceeded:
			return connect.NewError(code, errors.New("gave up checking credentials"))
		}
		return connect.NewError(connect.CodeInternal, errors.New("the control plane failed to check credentials"))
	}
	a, err := g.identity.Authority(ctx)
	if err != nil {
		return p, cannotCheck("load the identity authority", err)
	}
	if auth == "" {
		c, err := a.AuthenticateClient(ctx, client, clientUID)
		if errors.Is(err, identity.ErrUnknownClient) {
			g.log.InfoContext(ctx, "client certificate refused", "client", client, "reason", err)
			return p, errClientUnknown()
		}
		if err != nil {
			return p, cannotCheck("check a client certificate", err)
		}
		p.client = c.Name
		switch c.Role {
		case identity.RoleAdmin:
			p.admin = true
		case identity.RoleRouter:
			p.spaces, p.everySpace, p.only = c.Spaces, len(c.Spaces) == 0, routerCalls
		case identity.RoleUser:
			p.spaces = c.Spaces
		}
		return p, nil
	}
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || token == "" {
		return p, connect.NewError(connect.CodeUnauthenticated, errors.New(`the Authorization header must be "Bearer <token>"`))
	}
	admin, err := g.admin.get(ctx)
	if err != nil {
		return p, cannotCheck("load the admin token", err)
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(admin)) == 1 {
		p.admin = true
		return p, nil
	}
	spaces, err := a.AuthenticateAPIToken(ctx, token)
	if errors.Is(err, identity.ErrInvalidToken) {
		g.log.InfoContext(ctx, "API token refused", "reason", err)
		return p, connect.NewError(connect.CodeUnauthenticated, errors.New("the API token is invalid or expired"))
	}
	if err != nil {
		return p, cannotCheck("check an API token", err)
	}
	p.spaces = spaces
	return p, nil
}

// requestSpace is the space a request acts on: its space field (Get,
// List, Delete, ResumeActor), else the space of a message it carries
// (the file calls' file), else the metadata.space of the object it
// carries (Create, Update). named is false for a request with neither.
func requestSpace(msg any) (space string, named bool) {
	m, ok := msg.(interface{ ProtoReflect() protoreflect.Message })
	if !ok {
		return "", false
	}
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	if f := fields.ByName("space"); f != nil && f.Kind() == protoreflect.StringKind && !f.IsList() {
		return r.Get(f).String(), true
	}
	for i := range fields.Len() {
		f := fields.Get(i)
		if f.Kind() != protoreflect.MessageKind || f.IsList() || f.IsMap() {
			continue
		}
		// A request about one actor's files carries the actor's space
		// in its file field (ActorFileRequest).
		if inner := f.Message().Fields().ByName("space"); inner != nil && inner.Kind() == protoreflect.StringKind && !inner.IsList() {
			return r.Get(f).Message().Get(inner).String(), true
		}
		meta := f.Message().Fields().ByName("metadata")
		if meta == nil || meta.Kind() != protoreflect.MessageKind {
			continue
		}
		spaceField := meta.Message().Fields().ByName("space")
		if spaceField == nil || spaceField.Kind() != protoreflect.StringKind {
			continue
		}
		return r.Get(f).Message().Get(meta).Message().Get(spaceField).String(), true
	}
	return "", false
}

// adminTokenSecret keeps the admin token itself (not a hash): every
// replica must be able to write it out for the operator (AdminTokenFile).
const adminTokenSecret = "server/admin-token"

// adminToken is the installation's admin token, made by the first server
// that needs it and loaded once.
type adminToken struct {
	secrets store.Secrets

	mu    sync.Mutex
	value string
}

func (t *adminToken) get(ctx context.Context) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.value != "" {
		return t.value, nil
	}
	v, err := t.secrets.GetOrCreateSecret(ctx, adminTokenSecret, func() ([]byte, error) {
		raw := make([]byte, 32)
		rand.Read(raw)
		return []byte("torpor-admin-" + base64.RawURLEncoding.EncodeToString(raw)), nil
	})
	if err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	t.value = string(v)
	return t.value, nil
}

// AdminToken is the installation's admin token, created on first use.
func (s *Server) AdminToken(ctx context.Context) (string, error) { return s.admin.get(ctx) }

// WriteClientFiles writes the admin token and the CA certificate where
// Options say, for the operator's clients. Start does it first.
func (s *Server) WriteClientFiles(ctx context.Context) error {
	if s.opts.AdminTokenFile != "" {
		token, err := s.AdminToken(ctx)
		if err != nil {
			return err
		}
		if err := atomicfile.Write(s.opts.AdminTokenFile, []byte(token+"\n"), 0o600); err != nil {
			return fmt.Errorf("admin token file: %w", err)
		}
	}
	if s.opts.CAFile != "" {
		a, err := s.identity.Authority(ctx)
		if err != nil {
			return err
		}
		data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.CACertificate().Raw})
		if err := atomicfile.Write(s.opts.CAFile, data, 0o644); err != nil {
			return fmt.Errorf("CA file: %w", err)
		}
	}
	return nil
}
