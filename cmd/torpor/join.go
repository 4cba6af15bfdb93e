package main

import (
	"cmp"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/torpor-dev/torpor/internal/flagconfig"
	"github.com/torpor-dev/torpor/internal/identity"
)

// joinFlags are how a member (node agent, router) joins the control plane
// on its first start: a join token, and the CA it pins before sending it.
type joinFlags struct {
	token         string
	tokenFile     string
	caFingerprint string
	caFile        string
	kubeTokenFile string
}

// register adds the flags; made names the command that makes the token.
func (f *joinFlags) register(flags *pflag.FlagSet, made string) {
	flags.StringVar(&f.token, "join-token", "", "join token for the first start (default $TORPOR_JOIN_TOKEN; see "+made+")")
	flags.StringVar(&f.tokenFile, "join-token-file", "", "file holding the join token, read when no --join-token is given; a missing file is no token")
	flags.StringVar(&f.caFingerprint, "ca-fingerprint", "", "sha256:<hex> of the control plane's CA, printed with the join token")
	flags.StringVar(&f.caFile, "ca", "", "file of the control plane's CA certificate (PEM), instead of --ca-fingerprint")
	// TORPOR_CA is also the CLI's setting: exported for it, it must not
	// stand against a --ca-fingerprint given here.
	flagconfig.Alternatives(flags, "ca", "ca-fingerprint")
	flags.StringVar(&f.kubeTokenFile, "kubernetes-token-file", "", "on Kubernetes, instead of a join token: the pod's projected ServiceAccount token file (audience torpor.dev), read at every join")
}

// kubernetesToken reads the pod's ServiceAccount token at every join
// (the kubelet rotates the file); nil without --kubernetes-token-file.
func (f *joinFlags) kubernetesToken() func(context.Context) (string, error) {
	if f.kubeTokenFile == "" {
		return nil
	}
	return func(context.Context) (string, error) {
		data, err := os.ReadFile(f.kubeTokenFile)
		if err != nil {
			return "", fmt.Errorf("--kubernetes-token-file: %w", err)
		}
		return strings.TrimSpace(string(data)), nil
	}
}

// resolve returns the CA fingerprint to pin (given, or the certificate
// file's: flagconfig leaves one of them set) and the token (flag or environment; nil when there is none: a
// member with a certificate needs none, one without says so).
func (f *joinFlags) resolve() (caFingerprint string, token func(context.Context) (string, error), err error) {
	caFingerprint = f.caFingerprint
	if f.caFile != "" {
		data, err := os.ReadFile(f.caFile)
		if err != nil {
			return "", nil, fmt.Errorf("--ca: %w", err)
		}
		block, _ := pem.Decode(data)
		if block == nil || block.Type != "CERTIFICATE" {
			return "", nil, fmt.Errorf("--ca %s: no PEM CERTIFICATE block", f.caFile)
		}
		caFingerprint = identity.Fingerprint(block.Bytes)
	}
	secret := cmp.Or(f.token, os.Getenv("TORPOR_JOIN_TOKEN"))
	if secret == "" && f.tokenFile != "" {
		data, err := os.ReadFile(f.tokenFile)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", nil, fmt.Errorf("--join-token-file: %w", err)
		}
		secret = strings.TrimSpace(string(data))
	}
	if secret == "" {
		return caFingerprint, nil, nil
	}
	if caFingerprint == "" {
		return "", nil, errors.New("--join-token needs --ca-fingerprint or --ca: the control plane to trust must be known before the token is sent")
	}
	return caFingerprint, func(context.Context) (string, error) { return secret, nil }, nil
}
