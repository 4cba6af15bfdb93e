package cli

import (
	"cmp"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/identity"
)

func newLoginCommand(a *app) *cobra.Command {
	var name, fingerprint, joinToken string
	cmd := &cobra.Command{
		Use:     "login --name NAME --join-token T (--ca-fingerprint F | --ca FILE)",
		Example: "  torpor login --name alice --join-token T --ca-fingerprint sha256:... --server https://api.example.com:7070",
		Short:   "Log the CLI in as an API client: a certificate instead of a token",
		Long: `Log the CLI in as API client NAME: spend a client join token an admin made
(torpor token create --client NAME --role user|admin [--spaces A,B]) on a
certificate, trusting only a server of the CA that --ca-fingerprint (or the
certificate in --ca) pins. The certificate and its key are kept next to the
client config file, which then names the server, its CA and the client (and
no token); later commands authenticate with the certificate over mutual TLS
and renew it when two thirds of its life have passed. A certificate left to
expire needs a new token.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := client.Discover(client.Options{Server: a.serverFlag, CAFile: a.caFlag})
			if err != nil {
				return err
			}
			if fingerprint == "" && a.caFlag != "" {
				block, _ := pem.Decode(conn.CA)
				if block == nil || block.Type != "CERTIFICATE" {
					return fmt.Errorf("--ca %s: no PEM CERTIFICATE block", a.caFlag)
				}
				fingerprint = identity.Fingerprint(block.Bytes)
			}
			if fingerprint == "" {
				return errors.New("--ca-fingerprint or --ca: the control plane to trust must be known before the token is sent")
			}
			token := cmp.Or(joinToken, os.Getenv("TORPOR_JOIN_TOKEN"))
			if token == "" {
				return errors.New("--join-token (or $TORPOR_JOIN_TOKEN): made by torpor token create --client " + name)
			}
			configPath, err := client.ConfigPath()
			if err != nil {
				return err
			}
			credentials := "client-" + name + ".json"
			m := &identity.Member{
				Kind: identity.MemberClient, Name: name, ServerURL: conn.Server,
				File: filepath.Join(filepath.Dir(configPath), credentials), CAFingerprint: fingerprint,
				JoinToken: func(context.Context) (string, error) { return token, nil },
				Logger:    slog.New(slog.DiscardHandler),
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			creds, err := m.Join(ctx)
			if err != nil {
				return err
			}
			ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: creds.TrustBundle()[0]})
			if err := client.WriteConfig(configPath, client.Config{Server: conn.Server, CA: string(ca), Client: name, Credentials: credentials}); err != nil {
				return err
			}
			leaf := creds.Keypair().Certificate().Leaf
			fmt.Fprintf(cmd.OutOrStdout(), "Logged in to %s as %s (certificate until %s).\nClient config: %s\n",
				conn.Server, leaf.URIs[0], timestamp(leaf.NotAfter), configPath)
			return nil
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&name, "name", "", "the client's name, as its join token names it")
	flags.StringVar(&joinToken, "join-token", "", "client join token (default $TORPOR_JOIN_TOKEN)")
	flags.StringVar(&fingerprint, "ca-fingerprint", "", "sha256:<hex> of the control plane's CA, printed with the join token")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}
