package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/cli"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/node"
	"github.com/torpor-dev/torpor/internal/runtime/gvisor"
	"github.com/torpor-dev/torpor/internal/snapshot"
)

func init() { register(newNodeCommand) }

// nodeFlags are `torpor node`'s flags beyond node.Config's own fields.
type nodeFlags struct {
	labels    string
	snapshots string
	runtime   string
	runsc     string
	bridge    string
	cidr      string
	egress    bool
	join      joinFlags
}

func newNodeCommand() *cobra.Command {
	var cfg node.Config
	var f nodeFlags
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run the node agent: this host's worker slots, their sandboxes and snapshots",
		Long: `Run the node agent: it makes --workers worker slots (each with its own
network namespace on the node bridge), registers them with the control plane
and runs, checkpoints and restores actors in them. Stopping the agent leaves
running actors alone: the next start adopts them. Needs root.

The agent talks to the control plane over mutual TLS with a certificate
naming the node. The first start joins with a token an admin made for it
(torpor token create --node NAME), trusting only a server of the CA that
--ca-fingerprint (or the certificate in --ca) pins:

  torpor node --name NAME --server https://HOST:7070 --join-token T --ca-fingerprint sha256:...

The certificate is kept (and renewed) in the state directory, so later
starts need no token. The agent serves its API over TLS with the same
certificate, to the control plane only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			if err := completeNodeConfig(&cfg, &f, logger); err != nil {
				return err
			}
			a, err := node.New(cfg)
			if err != nil {
				return err
			}
			return a.Run(cmd.Context())
		},
	}
	flags := cmd.Flags()
	flags.StringVar(&cfg.ServerURL, "server", "https://127.0.0.1:7070", "control plane URL")
	f.join.register(flags, "torpor token create --node")
	flags.StringVar(&cfg.Name, "name", defaultNodeName(), "node name (a DNS-1123 label); workers are <name>-w<i>")
	flags.IntVar(&cfg.Workers, "workers", 2, "number of worker slots")
	flags.StringVar(&cfg.Pool, "pool", "default", "worker pool of this node's workers")
	flags.StringVar(&f.labels, "labels", "", "labels of the node and its workers: k=v,k2=v2")
	flags.StringVar(&cfg.Listen, "listen", "127.0.0.1:7071", "address to serve the node agent API on")
	flags.StringVar(&cfg.Advertise, "advertise", "", "URL the control plane reaches this agent at (default https://<listen>)")
	flags.StringVar(&cfg.StateDir, "state-dir", "", "node state: records, volumes, images, snapshot cache (default <data dir>/node/<name>)")
	flags.StringVar(&f.snapshots, "snapshots", "", "snapshot storage shared with the server: a directory, or s3://BUCKET[/PREFIX][?endpoint=HOST:PORT&region=R&insecure=true] with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (default <data dir>/snapshots)")
	flags.StringVar(&f.runtime, "runtime", gvisor.Class, "sandbox runtime: gvisor")
	flags.StringVar(&f.runsc, "runsc", "", "runsc binary (default: runsc next to this binary, else in PATH)")
	flags.StringVar(&f.bridge, "bridge", netns.DefaultBridge, "node bridge the workers' network namespaces attach to")
	flags.StringVar(&f.cidr, "cidr", netns.DefaultCIDR, "workers' subnet: the bridge gets the first address, worker i the (i+2)-th")
	flags.BoolVar(&f.egress, "egress", true, "let workloads reach networks beyond this host, masqueraded as it (turns on IPv4 forwarding); --egress=false: the host only")
	return cmd
}

func completeNodeConfig(cfg *node.Config, f *nodeFlags, logger *slog.Logger) error {
	cfg.Logger = logger
	var err error
	if cfg.CAFingerprint, cfg.JoinToken, err = f.join.resolve(); err != nil {
		return err
	}
	labels, err := parseLabels(f.labels)
	if err != nil {
		return err
	}
	cfg.Labels = labels
	if cfg.StateDir == "" || f.snapshots == "" {
		dir, err := cli.DataDir()
		if err != nil {
			return err
		}
		if cfg.StateDir == "" {
			cfg.StateDir = filepath.Join(dir, "node", cfg.Name)
		}
		if f.snapshots == "" {
			f.snapshots = filepath.Join(dir, "snapshots")
		}
	}
	if cfg.Snapshots, err = snapshot.Open(context.Background(), f.snapshots); err != nil {
		return fmt.Errorf("--snapshots: %w", err)
	}
	if cfg.Network, err = netns.New(netns.Config{Node: cfg.Name, Bridge: f.bridge, CIDR: f.cidr, Egress: f.egress}); err != nil {
		return err
	}
	if f.runtime != gvisor.Class {
		return fmt.Errorf("--runtime %q: want %s", f.runtime, gvisor.Class)
	}
	runsc, err := findRunsc(f.runsc)
	if err != nil {
		return err
	}
	cfg.Runtime, err = gvisor.New(gvisor.Config{Runsc: runsc, RootDir: filepath.Join(cfg.StateDir, "gvisor"), Logger: logger})
	return err
}

// parseLabels reads k=v,k2=v2.
func parseLabels(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	labels := map[string]string{}
	for pair := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--labels: %q is not key=value", pair)
		}
		labels[k] = v
	}
	return labels, nil
}

// findRunsc picks the runsc binary: the flag, else the one installed next
// to this binary (make build puts both in bin/), else PATH's.
func findRunsc(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if self, err := os.Executable(); err == nil {
		beside := filepath.Join(filepath.Dir(self), "runsc")
		if _, err := os.Stat(beside); err == nil {
			return beside, nil
		}
	}
	path, err := exec.LookPath("runsc")
	if err != nil {
		return "", errors.New("--runsc: no runsc next to this binary or in PATH (build it with `make runsc`)")
	}
	return path, nil
}

// defaultNodeName is the host name's first label made a DNS-1123 label.
func defaultNodeName() string {
	hostname, _ := os.Hostname()
	first, _, _ := strings.Cut(strings.ToLower(hostname), ".")
	name := strings.Trim(strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			return r
		}
		return '-'
	}, first), "-")
	if name == "" {
		return "local"
	}
	return name
}
