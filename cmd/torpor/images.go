package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/torpor-dev/torpor/internal/cli"
	"github.com/torpor-dev/torpor/internal/image"
)

// imageFlags set the image policy of torpor server, node and up: where
// templates' images may come from and the registries' credentials.
type imageFlags struct {
	registries []string
	dirs       []string
	authFile   string
}

func (f *imageFlags) register(flags *pflag.FlagSet) {
	flags.StringArrayVar(&f.registries, "allow-registry", nil,
		"a registry images may come from: HOST, HOST:PORT, *.DOMAIN or * (repeat for more; default none). A pattern with '*' never reaches a loopback, private or link-local address; name such a registry exactly")
	flags.StringArrayVar(&f.dirs, "allow-image-dir", nil,
		"a directory local images (oci:PATH) may be read from, besides <data dir>/images (repeat for more)")
	flags.StringVar(&f.authFile, "registry-auth", "",
		"YAML file of registry credentials, HOST: {username: U, password: P} or HOST: {token: T}, readable by its owner only (default: every registry anonymously)")
}

// policy is the policy the flags set, with dataDir's images directory
// (default: the data directory's) always allowed.
func (f *imageFlags) policy(dataDir string) (*image.Policy, error) {
	if dataDir == "" {
		var err error
		if dataDir, err = cli.DataDir(); err != nil {
			return nil, err
		}
	}
	var dirs []string
	for _, d := range append([]string{filepath.Join(dataDir, "images")}, f.dirs...) {
		abs, err := filepath.Abs(d)
		if err != nil {
			return nil, fmt.Errorf("--allow-image-dir %s: %w", d, err)
		}
		dirs = append(dirs, abs)
	}
	cfg := image.PolicyConfig{Registries: f.registries, Dirs: dirs}
	if f.authFile != "" {
		auth, err := image.LoadRegistryAuth(f.authFile)
		if err != nil {
			return nil, fmt.Errorf("--registry-auth: %w", err)
		}
		cfg.Auth = auth
	}
	p, err := image.NewPolicy(cfg)
	if err != nil {
		return nil, fmt.Errorf("image policy: %w", err)
	}
	return p, nil
}
