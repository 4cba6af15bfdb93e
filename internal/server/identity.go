package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/kube"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
)

// identityService serves IdentityService. Mints are authorized against the
// store on every call (identity.AuthorizeWorkload), so an assignment one
// replica commits is honoured by the next call to any replica.
type identityService struct {
	store     store.Store
	authority *identity.Loader
	log       *slog.Logger
	// kube verifies Kubernetes tokens; nil off Kubernetes.
	kube *kube.Cluster
	// ingressDomains are those routers may have certificates for.
	ingressDomains []string
}

func (s *Server) newIdentityService() *identityService {
	domains := []string{client.DefaultDomain}
	if len(s.opts.IngressDomains) > 0 {
		domains = nil
		for _, d := range s.opts.IngressDomains {
			domains = append(domains, strings.Trim(strings.ToLower(d), "."))
		}
	}
	return &identityService{store: s.store, authority: s.identity, log: s.log, kube: s.opts.Kubernetes, ingressDomains: domains}
}

// identityConfig is the trust domain and JWT issuer of Options: by
// default the issuer is the API's listen address over https.
func (s *Server) identityConfig() identity.Config {
	cfg := identity.Config{TrustDomain: s.opts.TrustDomain, Issuer: s.opts.Issuer, MemberCertTTL: s.opts.MemberCertTTL}
	if cfg.Issuer != "" {
		return cfg
	}
	host, port, err := net.SplitHostPort(s.opts.Listen)
	if err != nil {
		cfg.Issuer = "https://localhost"
		return cfg
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	cfg.Issuer = "https://" + net.JoinHostPort(host, port)
	return cfg
}

// handler serves the service. Answers are not gzipped: keys, signatures
// and tokens do not compress, and trying costs more than signing. (The
// caller's node certificate is put in the context by Handler.)
func (i *identityService) handler(opts ...connect.HandlerOption) (string, http.Handler) {
	opts = append(opts, connect.WithCompression("gzip", nil, nil))
	return torporv1connect.NewIdentityServiceHandler(i, opts...)
}

// One answer per kind of refusal: a refused caller learns nothing about
// why (the log does).
func errNoNodeCertificate() error {
	return connect.NewError(connect.CodeUnauthenticated, errors.New("a node certificate is required"))
}

func errMintDenied() error {
	return connect.NewError(connect.CodePermissionDenied, identity.ErrDenied)
}

func errTokenRefused() error {
	return connect.NewError(connect.CodeUnauthenticated, errors.New("the join token is invalid, expired or already used"))
}

// failure answers an error that is not a refusal: a caller's mistake names
// its field; anything else is logged and answered without detail.
func (i *identityService) failure(ctx context.Context, what string, err error) error {
	var fe *validate.FieldError
	if errors.As(err, &fe) {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	i.log.ErrorContext(ctx, what, "err", err)
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s: the control plane cannot do this now, retry", what))
}

func (i *identityService) Join(ctx context.Context, req *connect.Request[torporv1.JoinRequest]) (*connect.Response[torporv1.IssuedCertificate], error) {
	a, err := i.authority.Authority(ctx)
	if err != nil {
		return nil, i.failure(ctx, "join", err)
	}
	name := req.Msg.GetName()
	var issued *identity.Issued
	if req.Msg.GetKubernetesToken() != "" {
		if req.Msg.GetToken() != "" {
			return nil, invalidArgument("token", "give a join token or a Kubernetes token, not both")
		}
		issued, err = i.joinByKubernetes(ctx, a, req.Msg)
	} else {
		issued, err = a.Join(ctx, req.Msg.GetToken(), name, req.Msg.GetCsr())
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return nil, err
	}
	if errors.Is(err, identity.ErrInvalidToken) {
		i.log.WarnContext(ctx, "join refused", "member", name, "reason", err)
		return nil, errTokenRefused()
	}
	if err != nil {
		return nil, i.failure(ctx, "join", err)
	}
	i.log.InfoContext(ctx, "member joined", "spiffe_id", issued.SPIFFEID, "expires", issued.Certificate.NotAfter)
	return connect.NewResponse(issuedCertificate(a, issued)), nil
}

// RenewCertificate renews the caller's own certificate: a node's, or a
// client's that still exists as its certificate says.
func (i *identityService) RenewCertificate(ctx context.Context, req *connect.Request[torporv1.RenewCertificateRequest]) (*connect.Response[torporv1.IssuedCertificate], error) {
	a, err := i.authority.Authority(ctx)
	if err != nil {
		return nil, i.failure(ctx, "renew certificate", err)
	}
	var issued *identity.Issued
	if node, ok := identity.CallerNode(ctx); ok {
		issued, err = a.IssueNodeCertificate(node, req.Msg.GetCsr())
	} else if name, uid, ok := identity.CallerClient(ctx); ok {
		issued, err = a.RenewClient(ctx, name, uid, req.Msg.GetCsr())
		if errors.Is(err, identity.ErrUnknownClient) {
			i.log.WarnContext(ctx, "renewal refused", "client", name, "reason", err)
			return nil, errClientUnknown()
		}
	} else {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("a node or client certificate is required"))
	}
	if err != nil {
		return nil, i.failure(ctx, "renew certificate", err)
	}
	return connect.NewResponse(issuedCertificate(a, issued)), nil
}

// IssueIngressCertificate issues a router its HTTPS serving certificate,
// for a domain the control plane serves (Options.IngressDomains) only.
func (i *identityService) IssueIngressCertificate(ctx context.Context, req *connect.Request[torporv1.IssueIngressCertificateRequest]) (*connect.Response[torporv1.IssuedCertificate], error) {
	domain := strings.Trim(strings.ToLower(req.Msg.GetDomain()), ".")
	if !slices.Contains(i.ingressDomains, domain) {
		return nil, invalidArgument("domain", "%q is not a domain this control plane serves (%s; see torpor server --ingress-domain)", req.Msg.GetDomain(), strings.Join(i.ingressDomains, ", "))
	}
	router := "admin"
	if name, _, ok := identity.CallerClient(ctx); ok {
		router = name
	}
	a, err := i.authority.Authority(ctx)
	if err != nil {
		return nil, i.failure(ctx, "issue ingress certificate", err)
	}
	issued, err := a.IssueIngressCertificate(router, domain, req.Msg.GetCsr())
	if err != nil {
		return nil, i.failure(ctx, "issue ingress certificate", err)
	}
	i.log.InfoContext(ctx, "ingress certificate issued", "router", router, "domain", domain, "expires", issued.Certificate.NotAfter)
	return connect.NewResponse(issuedCertificate(a, issued)), nil
}

func errClientUnknown() error {
	return connect.NewError(connect.CodeUnauthenticated, errors.New("the client certificate's client was deleted or joined again: join with a new token"))
}

var (
	tokenPurposes = map[torporv1.TokenPurpose]identity.TokenPurpose{
		torporv1.TokenPurpose_TOKEN_PURPOSE_NODE_JOIN:   identity.PurposeNodeJoin,
		torporv1.TokenPurpose_TOKEN_PURPOSE_CLIENT_JOIN: identity.PurposeClientJoin,
		torporv1.TokenPurpose_TOKEN_PURPOSE_API:         identity.PurposeAPI,
		torporv1.TokenPurpose_TOKEN_PURPOSE_E2B:         identity.PurposeE2B,
	}
	clientRoles = map[torporv1.ClientRole]identity.Role{
		torporv1.ClientRole_CLIENT_ROLE_ADMIN:  identity.RoleAdmin,
		torporv1.ClientRole_CLIENT_ROLE_ROUTER: identity.RoleRouter,
		torporv1.ClientRole_CLIENT_ROLE_USER:   identity.RoleUser,
	}
)

// reverse inverts a one-to-one map.
func reverse[K, V comparable](m map[K]V) map[V]K {
	out := make(map[V]K, len(m))
	for k, v := range m {
		out[v] = k
	}
	return out
}

var (
	apiTokenPurposes = reverse(tokenPurposes)
	apiClientRoles   = reverse(clientRoles)
)

// CreateToken refuses nodes: a node must not let other hosts join. (Only
// an admin gets this far otherwise: see accessRules.)
func (i *identityService) CreateToken(ctx context.Context, req *connect.Request[torporv1.CreateTokenRequest]) (*connect.Response[torporv1.CreateTokenResponse], error) {
	if node, ok := identity.CallerNode(ctx); ok {
		i.log.WarnContext(ctx, "token creation refused", "node", node, "reason", "callers with a node certificate may not create tokens")
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New("nodes may not create tokens"))
	}
	purpose, ok := tokenPurposes[req.Msg.GetPurpose()]
	if !ok {
		return nil, invalidArgument("purpose", "%s is not a token purpose (NODE_JOIN, CLIENT_JOIN, API or E2B)", req.Msg.GetPurpose())
	}
	var role identity.Role
	if r := req.Msg.GetRole(); r != torporv1.ClientRole_CLIENT_ROLE_UNSPECIFIED {
		if role, ok = clientRoles[r]; !ok {
			return nil, invalidArgument("role", "%s is not a role (ADMIN, ROUTER or USER)", r)
		}
	}
	a, err := i.authority.Authority(ctx)
	if err != nil {
		return nil, i.failure(ctx, "create token", err)
	}
	tok, err := a.CreateToken(ctx, identity.TokenRequest{
		Purpose: purpose, Name: req.Msg.GetName(), Spaces: req.Msg.GetSpaces(), Role: role, TTL: req.Msg.GetTtl().AsDuration(),
	})
	if err != nil {
		return nil, i.failure(ctx, "create token", err)
	}
	i.log.InfoContext(ctx, "token created", "id", tok.ID, "purpose", purpose, "name", req.Msg.GetName(), "role", role, "spaces", req.Msg.GetSpaces(), "expires", tok.Expires)
	return connect.NewResponse(&torporv1.CreateTokenResponse{
		Token: tok.Secret, ExpireTime: timestamppb.New(tok.Expires), CaFingerprint: a.CAFingerprint(), Id: tok.ID,
	}), nil
}

func (i *identityService) ListTokens(ctx context.Context, _ *connect.Request[torporv1.ListTokensRequest]) (*connect.Response[torporv1.ListTokensResponse], error) {
	a, err := i.authority.Authority(ctx)
	if err != nil {
		return nil, i.failure(ctx, "list tokens", err)
	}
	infos, err := a.ListTokens(ctx)
	if err != nil {
		return nil, i.failure(ctx, "list tokens", err)
	}
	resp := &torporv1.ListTokensResponse{}
	for _, info := range infos {
		resp.Tokens = append(resp.Tokens, tokenInfo(info))
	}
	return connect.NewResponse(resp), nil
}

func (i *identityService) RevokeToken(ctx context.Context, req *connect.Request[torporv1.RevokeTokenRequest]) (*connect.Response[torporv1.RevokeTokenResponse], error) {
	a, err := i.authority.Authority(ctx)
	if err != nil {
		return nil, i.failure(ctx, "revoke token", err)
	}
	info, err := a.RevokeToken(ctx, req.Msg.GetId())
	if errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no token's id starts with %q (torpor token list)", req.Msg.GetId()))
	}
	if err != nil {
		return nil, i.failure(ctx, "revoke token", err)
	}
	i.log.InfoContext(ctx, "token revoked", "id", info.ID, "purpose", info.Purpose, "name", info.Name)
	return connect.NewResponse(&torporv1.RevokeTokenResponse{Token: tokenInfo(info)}), nil
}

func tokenInfo(info identity.TokenInfo) *torporv1.TokenInfo {
	return &torporv1.TokenInfo{
		Id: info.ID, Purpose: apiTokenPurposes[info.Purpose], Name: info.Name, Spaces: info.Spaces,
		Role: apiClientRoles[info.Role], CreateTime: timestamppb.New(info.Created), ExpireTime: timestamppb.New(info.Expires),
	}
}

func (i *identityService) ListClients(ctx context.Context, _ *connect.Request[torporv1.ListClientsRequest]) (*connect.Response[torporv1.ListClientsResponse], error) {
	a, err := i.authority.Authority(ctx)
	if err != nil {
		return nil, i.failure(ctx, "list clients", err)
	}
	clients, err := a.ListClients(ctx)
	if err != nil {
		return nil, i.failure(ctx, "list clients", err)
	}
	resp := &torporv1.ListClientsResponse{}
	for _, c := range clients {
		resp.Clients = append(resp.Clients, &torporv1.Client{
			Name: c.Name, Uid: c.UID, Role: apiClientRoles[c.Role], Spaces: c.Spaces, CreateTime: timestamppb.New(c.Created),
		})
	}
	return connect.NewResponse(resp), nil
}

func (i *identityService) DeleteClient(ctx context.Context, req *connect.Request[torporv1.DeleteClientRequest]) (*connect.Response[torporv1.DeleteClientResponse], error) {
	a, err := i.authority.Authority(ctx)
	if err != nil {
		return nil, i.failure(ctx, "delete client", err)
	}
	err = a.DeleteClient(ctx, req.Msg.GetName())
	if errors.Is(err, store.ErrNotFound) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("client %q not found (torpor client list)", req.Msg.GetName()))
	}
	if err != nil {
		return nil, i.failure(ctx, "delete client", err)
	}
	i.log.InfoContext(ctx, "client deleted", "client", req.Msg.GetName())
	return connect.NewResponse(&torporv1.DeleteClientResponse{}), nil
}

func (i *identityService) MintCert(ctx context.Context, req *connect.Request[torporv1.MintCertRequest]) (*connect.Response[torporv1.IssuedCertificate], error) {
	a, w, err := i.authorize(ctx, req.Msg.GetWorkload())
	if err != nil {
		return nil, err
	}
	issued, err := a.IssueWorkloadCertificate(w, req.Msg.GetCsr())
	if err != nil {
		return nil, i.failure(ctx, "mint certificate", err)
	}
	return connect.NewResponse(issuedCertificate(a, issued)), nil
}

func (i *identityService) MintJWT(ctx context.Context, req *connect.Request[torporv1.MintJWTRequest]) (*connect.Response[torporv1.MintJWTResponse], error) {
	a, w, err := i.authorize(ctx, req.Msg.GetWorkload())
	if err != nil {
		return nil, err
	}
	token, expires, err := a.MintJWT(w, req.Msg.GetAudience())
	if err != nil {
		return nil, i.failure(ctx, "mint JWT", err)
	}
	return connect.NewResponse(&torporv1.MintJWTResponse{
		Token: token, ExpireTime: timestamppb.New(expires), SpiffeId: identity.ActorID(a.TrustDomain(), w.Space, w.Actor),
	}), nil
}

// authorize decides a mint from the store: the caller must be the node of
// the claimed worker, which must host the claimed actor, which must name
// the worker back.
func (i *identityService) authorize(ctx context.Context, msg *torporv1.WorkloadClaim) (*identity.Authority, identity.Workload, error) {
	node, ok := identity.CallerNode(ctx)
	if !ok {
		return nil, identity.Workload{}, errNoNodeCertificate()
	}
	claim := identity.WorkloadClaim{
		WorkerNamespace: msg.GetWorkerNamespace(), WorkerName: msg.GetWorkerName(),
		WorkerUID: msg.GetWorkerUid(), ActorUID: msg.GetActorUid(),
	}
	for _, f := range []struct{ path, value string }{
		{"workload.workerNamespace", claim.WorkerNamespace}, {"workload.workerName", claim.WorkerName},
		{"workload.workerUid", claim.WorkerUID}, {"workload.actorUid", claim.ActorUID},
	} {
		if f.value == "" {
			return nil, identity.Workload{}, invalidArgument(f.path, "required")
		}
	}
	a, err := i.authority.Authority(ctx)
	if err != nil {
		return nil, identity.Workload{}, i.failure(ctx, "authorize mint", err)
	}
	w, err := identity.AuthorizeWorkload(ctx, identity.Records{Worker: i.store.Workers().Get, Actor: i.store.Actors().Get}, node, claim)
	if errors.Is(err, identity.ErrDenied) {
		i.log.WarnContext(ctx, "mint denied", "node", node,
			"worker", claim.WorkerNamespace+"/"+claim.WorkerName, "worker_uid", claim.WorkerUID, "actor_uid", claim.ActorUID, "reason", err)
		return nil, identity.Workload{}, errMintDenied()
	}
	if err != nil {
		return nil, identity.Workload{}, i.failure(ctx, "authorize mint", err)
	}
	return a, w, nil
}

func issuedCertificate(a *identity.Authority, issued *identity.Issued) *torporv1.IssuedCertificate {
	return &torporv1.IssuedCertificate{
		CertificateChain: issued.Chain,
		TrustBundle:      a.TrustBundle(),
		SpiffeId:         issued.SPIFFEID,
		ExpireTime:       timestamppb.New(issued.Certificate.NotAfter),
	}
}
