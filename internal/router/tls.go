package router

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/identity"
)

// The router serves HTTPS with a certificate from the installation's CA
// (IdentityService.IssueIngressCertificate) for *.<domain> and <domain>,
// the hosts of E2B sandboxes (<port>-<id>.<domain>, what the E2B SDK
// dials over https), and the loopback names, for clients on the router's
// host that address it directly (E2B_SANDBOX_URL=https://127.0.0.1:PORT).
// Clients trust the CA (ca.pem; NODE_EXTRA_CA_CERTS for the SDK on
// Node). The key is made here and never leaves the router.

// ingressIssuer is the part of the control plane that certifies the
// router's HTTPS.
type ingressIssuer interface {
	IssueIngressCertificate(context.Context, *connect.Request[torporv1.IssueIngressCertificateRequest]) (*connect.Response[torporv1.IssuedCertificate], error)
}

// ingressRenewRetry is how soon a failed renewal is tried again.
const ingressRenewRetry = time.Minute

// IngressTLS is the router's HTTPS certificate, renewed by Run.
type IngressTLS struct {
	router *Router
	issuer ingressIssuer
	kp     *identity.Keypair
}

// IngressTLS gets the router's first HTTPS certificate from the control
// plane; serve with Config, and Run to keep it renewed.
func (r *Router) IngressTLS(ctx context.Context) (*IngressTLS, error) {
	t := &IngressTLS{router: r, issuer: torporv1connect.NewIdentityServiceClient(r.cfg.HTTPClient, r.cfg.Server)}
	cert, err := t.issue(ctx)
	if err != nil {
		return nil, err
	}
	t.kp = identity.NewKeypair(cert)
	return t, nil
}

func (t *IngressTLS) issue(ctx context.Context) (tls.Certificate, error) {
	key, csr, err := identity.NewCSR()
	if err != nil {
		return tls.Certificate{}, err
	}
	domain := t.router.cfg.Domain
	resp, err := t.issuer.IssueIngressCertificate(ctx, connect.NewRequest(&torporv1.IssueIngressCertificateRequest{Csr: csr, Domain: domain}))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("HTTPS certificate for *.%s: %w", domain, err)
	}
	cert, err := identity.TLSCertificate(key, resp.Msg.GetCertificateChain())
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("HTTPS certificate for *.%s: %w", domain, err)
	}
	return cert, nil
}

// Config is the TLS configuration of the router's HTTPS listener: the
// current certificate, whatever name the client asks for.
func (t *IngressTLS) Config() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return t.kp.Certificate(), nil },
	}
}

// Run replaces the certificate when two thirds of its lifetime have
// passed, until ctx is done.
func (t *IngressTLS) Run(ctx context.Context) error {
	log := t.router.log
	for {
		leaf := t.kp.Certificate().Leaf
		wait := time.Until(leaf.NotAfter) * 2 / 3
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			cert, err := t.issue(ctx)
			if err == nil {
				t.kp.Set(cert)
				log.Info("renewed the HTTPS certificate", "domain", t.router.cfg.Domain, "expires", cert.Leaf.NotAfter)
				break
			}
			log.Error("renew the HTTPS certificate", "err", err, "expires", leaf.NotAfter, "retry_in", ingressRenewRetry)
			wait = ingressRenewRetry
		}
	}
}
