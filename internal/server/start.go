package server

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/torpor-dev/torpor/internal/httpserve"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/rungroup"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
)

// Running is a control plane serving its API: what Start returns to
// `torpor server`, `torpor up` and the test harnesses alike.
type Running struct {
	// Server is the control plane (tests install engine hooks on it).
	Server *Server
	// Store and Objects are the record store and the snapshot storage it
	// opened; Stop closes the store.
	Store   store.Store
	Objects snapshot.ObjectStore
	// URL is the API's base URL, https://<bound address>.
	URL string
	// E2BURL is the base URL of the plain-HTTP E2B-compatible API,
	// http://<bound address>; empty when it has no listener of its own.
	E2BURL string
	// Authority is the installation's CA, CAPEM its certificate (what
	// clients verify the API with), AdminToken the admin's API token.
	Authority  *identity.Authority
	CAPEM      []byte
	AdminToken string

	group    *rungroup.Group
	stopOnce sync.Once
	stopErr  error
}

// Start opens the store and snapshot storage opts name, writes the client
// files, makes the server certificate and serves the API on opts.Listener
// (else opts.Listen) with the background work, in that order: the
// background work calls node agents with the certificate. When it
// returns, the API answers; on an error nothing is left running. ctx
// bounds the start only: the control plane runs until Stop, or until the
// context given to Run ends.
func Start(ctx context.Context, opts Options) (r *Running, err error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	r = &Running{}
	var closers []func() error
	defer func() {
		if err != nil {
			for _, c := range closers {
				c()
			}
		}
	}()
	if r.Store, err = store.Open(ctx, opts.Store); err != nil {
		return nil, fmt.Errorf("open store %s: %w", opts.Store, err)
	}
	closers = append(closers, r.Store.Close)
	if r.Objects, err = snapshot.Open(ctx, opts.Snapshots); err != nil {
		return nil, fmt.Errorf("open snapshot storage %s: %w", opts.Snapshots, err)
	}
	r.Server = New(r.Store, r.Objects, opts)
	if err := r.Server.WriteClientFiles(ctx); err != nil {
		return nil, err
	}
	if r.Authority, err = r.Server.Authority(ctx); err != nil {
		return nil, err
	}
	if r.AdminToken, err = r.Server.AdminToken(ctx); err != nil {
		return nil, err
	}
	r.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.Authority.CACertificate().Raw})
	ln := opts.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", opts.Listen); err != nil {
			return nil, fmt.Errorf("listen on %s: %w", opts.Listen, err)
		}
	}
	closers = append(closers, ln.Close)
	r.URL = "https://" + ln.Addr().String()
	tlsConfig, renew, err := r.Server.TLSConfig(ctx, ln.Addr())
	if err != nil {
		return nil, fmt.Errorf("serve API: %w", err)
	}
	e2bLn := opts.E2BListener
	if e2bLn == nil && opts.E2BListen != "" {
		if e2bLn, err = net.Listen("tcp", opts.E2BListen); err != nil {
			return nil, fmt.Errorf("listen on %s (E2B API): %w", opts.E2BListen, err)
		}
	}
	if e2bLn != nil {
		closers = append(closers, e2bLn.Close)
		r.E2BURL = "http://" + e2bLn.Addr().String()
	}
	r.group = rungroup.New(ctx)
	// Stopped last: the API serves with the certificate, and the
	// background work calls node agents with it.
	r.group.Go("server certificate renewal", renew)
	h := r.Server.handlers()
	r.group.Go("API", func(ctx context.Context) error { return httpserve.Serve(ctx, ln, h.api, tlsConfig) })
	if e2bLn != nil {
		r.group.Go("E2B API", func(ctx context.Context) error { return httpserve.Serve(ctx, e2bLn, h.e2b, nil) })
	}
	r.group.Go("background work", func(ctx context.Context) error {
		r.Server.RunBackground(ctx)
		return nil
	})
	if opts.Kubernetes != nil {
		r.group.Go("Kubernetes", r.Server.RunKubernetes)
	}
	opts.Logger.Info("serving API", "listen", ln.Addr().String(), "store", opts.Store, "snapshots", opts.Snapshots,
		"admin_token_file", opts.AdminTokenFile, "ca_file", opts.CAFile, "e2b_url", r.E2BURL, "e2b_domain", opts.E2BDomain)
	return r, nil
}

// Failed is closed when a part of the control plane (the API, the
// background work) ended on its own.
func (r *Running) Failed() <-chan struct{} { return r.group.Failed() }

// Run serves until ctx is done or a part fails, then stops.
func (r *Running) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case <-r.Failed():
	}
	return r.Stop()
}

// Stop stops the background work, drains the API, ends what the server
// still runs (Server.Close) and only then closes the store; it returns the
// same to every call.
func (r *Running) Stop() error {
	r.stopOnce.Do(func() {
		err := r.group.Stop()
		r.Server.Close()
		r.stopErr = errors.Join(err, r.Store.Close())
	})
	return r.stopErr
}

// Run starts the control plane (Start) and serves until ctx is done.
func Run(ctx context.Context, opts Options) error {
	r, err := Start(ctx, opts)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
