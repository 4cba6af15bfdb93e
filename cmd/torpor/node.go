package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/cli"
	"github.com/torpor-dev/torpor/internal/gateproc"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/node"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/gvisor"
	"github.com/torpor-dev/torpor/internal/slotgate"
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
	// dns are the upstreams of the node's resolver (node.Config.DNS).
	dns     string
	cleanup bool
	// cacheMiB bounds the snapshot cache (node.Config.CacheBytes).
	cacheMiB int
	join     joinFlags
	images   imageFlags
}

func newNodeCommand() *cobra.Command {
	var cfg node.Config
	var f nodeFlags
	var logs logFlags
	var traces traceFlags
	cmd := &cobra.Command{
		Use:     "node",
		Example: "  torpor node --name node-b --server https://api.example.com:7070 --join-token T --ca-fingerprint sha256:... --workers 8\n  torpor node --cleanup --name node-b --state-dir /var/lib/torpor/node",
		Short:   "Run the node agent: this host's worker slots, their sandboxes and snapshots",
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
certificate, to the control plane only.

Routers reach the workloads through the node's slot gate (--gate-listen),
a process of its own that the agent starts and that outlives it, so a
restart of the agent (kill -9, or SIGTERM for an upgrade) cuts no routed
connection (exec and log streams through the agent's API are cut).

SIGTERM stops the agent. Running actors' sandboxes stay (the next start
adopts them, so an upgrade loses nothing), with the workers' network and
the slot gate serving their connections; warm sandboxes go. With no actor
left running on the node, nothing of it stays: no process, mount, network
namespace, veth, bridge or nftables table.

For a node stopped for good, suspend its actors first (torpor actor
suspend NAME...; torpor worker list shows which run on it), stop the agent,
then run 'torpor node --cleanup' with the same --name, --state-dir,
--bridge and --cidr: it stops the slot gate process and removes every
sandbox, mount, network namespace,
veth, bridge and nftables table of the node, says what it removed, and
exits. The workloads it removes are lost; their actors resume from their
last snapshots.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.cleanup {
				return cleanupNode(cmd.Context(), cmd.OutOrStdout(), cfg, f)
			}
			if f.cacheMiB <= 0 {
				return fmt.Errorf("--snapshot-cache-mib %d: must be positive", f.cacheMiB)
			}
			logger, err := logs.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			stop, err := traces.start("torpor-node", logger)
			if err != nil {
				return err
			}
			defer stop()
			if err := completeNodeConfig(&cfg, &f, logger); err != nil {
				return err
			}
			if cfg.Images, err = f.images.policy(""); err != nil {
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
	flags.StringVar(&cfg.GateListen, "gate-listen", "", "address of the slot gate routers reach workloads through (default: where the last run listened, else the --listen host with a free port)")
	flags.StringVar(&cfg.Advertise, "advertise", "", "URL the control plane reaches this agent at (default https://<listen>)")
	flags.StringVar(&cfg.StateDir, "state-dir", "", "node state: records, volumes, images, snapshot cache (default <data dir>/node/<name>)")
	flags.IntVar(&f.cacheMiB, "snapshot-cache-mib", 4096, "MiB of unpacked snapshots (from storage and local checkpoints) the node keeps for restores beyond those in use; the least recently used go first")
	flags.StringVar(&f.snapshots, "snapshots", "", "snapshot storage shared with the server: a directory, or s3://BUCKET[/PREFIX][?endpoint=HOST:PORT&region=R&insecure=true] with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (default <data dir>/snapshots)")
	flags.StringVar(&f.runtime, "runtime", gvisor.Class, "sandbox runtime: gvisor")
	flags.StringVar(&f.runsc, "runsc", "", "runsc binary (default: runsc next to this binary, else in PATH)")
	flags.StringVar(&f.bridge, "bridge", netns.DefaultBridge, "node bridge the workers' network namespaces attach to")
	flags.StringVar(&f.cidr, "cidr", netns.DefaultCIDR, "workers' subnet: the bridge gets the first address, worker i the (i+2)-th")
	flags.BoolVar(&f.egress, "egress", true, "let workloads reach networks beyond this host as their egress policies allow, masqueraded as it (turns on IPv4 forwarding); --egress=false: every workload's policy is deny (nothing beyond the node), and its start says so")
	flags.StringVar(&f.dns, "dns", "", dnsFlagHelp)
	f.images.register(flags)
	flags.BoolVar(&f.cleanup, "cleanup", false, "stop the slot gate process and remove every sandbox, mount, network namespace, veth, bridge and nftables table of the stopped node, say what was removed, and exit (suspend its actors first: running workloads are lost)")
	logs.register(cmd.PersistentFlags(), "info")
	traces.register(cmd.PersistentFlags())
	cmd.AddCommand(newNodeGateCommand(&logs))
	return cmd
}

// cleanupNode removes what a node stopped for good leaves on the host:
// the sandboxes of actors still running there, runsc's and their mounts,
// and the workers' network. It refuses while an agent runs on the state
// directory.
func cleanupNode(ctx context.Context, out io.Writer, cfg node.Config, f nodeFlags) error {
	if cfg.StateDir == "" {
		dir, err := cli.DataDir()
		if err != nil {
			return err
		}
		cfg.StateDir = filepath.Join(dir, "node", cfg.Name)
	}
	unlock, err := node.LockStateDir(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("cleanup: %w (stop the agent first)", err)
	}
	defer unlock()
	var removed []string
	pid, err := gateproc.StopLeftover(ctx, cfg.StateDir)
	if pid != 0 && err == nil {
		removed = append(removed, fmt.Sprintf("slot gate process %d", pid))
	}
	if err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	// A sandbox the gate left frozen would not let its containers be
	// deleted: thawed first.
	if _, err := slotgate.ThawMarked(ctx, gateproc.FreezeMarks(cfg.StateDir), func(c string) slotgate.Pauser { return gvisor.Pauser(c) }); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	network, err := netns.New(netns.Config{Node: cfg.Name, Bridge: f.bridge, CIDR: f.cidr})
	if err != nil {
		return err
	}
	runsc, err := findRunsc(f.runsc)
	if err != nil {
		return err
	}
	rt, err := gvisor.New(gvisor.Config{ConfigureNetwork: netns.Configure, Runsc: runsc, RootDir: filepath.Join(cfg.StateDir, "gvisor"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	mounts, err := runtime.MountsUnder(cfg.StateDir)
	if err != nil {
		return err
	}
	sandboxes, err := rt.Sandboxes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range sandboxes {
		if err := rt.Terminate(ctx, runtime.Slot{Name: name}); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "sandbox of worker "+name)
	}
	errs = append(errs, rt.Close(ctx))
	left, err := runtime.MountsUnder(cfg.StateDir)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if !slices.Contains(left, m) {
			removed = append(removed, "mount "+m)
		}
	}
	fromNetwork, err := network.RemoveAll(ctx)
	removed = append(removed, fromNetwork...)
	errs = append(errs, err)
	for _, r := range removed {
		fmt.Fprintln(out, "removed", r)
	}
	if len(removed) == 0 {
		fmt.Fprintf(out, "nothing of node %s was left\n", cfg.Name)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleanup of node %s: %w", cfg.Name, err)
	}
	return nil
}

func completeNodeConfig(cfg *node.Config, f *nodeFlags, logger *slog.Logger) error {
	cfg.Logger = logger
	var err error
	if cfg.CAFingerprint, cfg.JoinToken, err = f.join.resolve(); err != nil {
		return err
	}
	cfg.KubernetesToken = f.join.kubernetesToken()
	labels, err := parseLabels(f.labels)
	if err != nil {
		return err
	}
	cfg.Labels = labels
	// torpor up has no such flag: its node keeps the default.
	cfg.CacheBytes = int64(f.cacheMiB) << 20
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
	cfg.NoEgress = !f.egress
	if cfg.DNS, err = dnsUpstreams(f.dns, "/etc/resolv.conf"); err != nil {
		return err
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
	if cfg.Runtime, err = gvisor.New(gvisor.Config{ConfigureNetwork: netns.Configure, Runsc: runsc, RootDir: filepath.Join(cfg.StateDir, "gvisor"), Logger: logger}); err != nil {
		return err
	}
	cfg.GateCommand, err = gateCommand()
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

const dnsFlagHelp = "resolvers the node's resolver forwards the names workloads may resolve to: ip[:port],... (default: the nameservers of this host's /etc/resolv.conf; a loopback one, such as systemd-resolved's 127.0.0.53, works: the node's resolver runs on the host)"

// dnsUpstreams reads --dns, or without it the nameservers of resolvConf,
// as ip:port.
func dnsUpstreams(flag, resolvConf string) ([]string, error) {
	var items []string
	if flag != "" {
		items = strings.Split(flag, ",")
	} else {
		b, err := os.ReadFile(resolvConf)
		if err != nil {
			return nil, fmt.Errorf("--dns not given and %s unreadable: %w", resolvConf, err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if fields := strings.Fields(line); len(fields) >= 2 && fields[0] == "nameserver" {
				items = append(items, fields[1])
			}
		}
	}
	var out []string
	for _, item := range items {
		item = strings.TrimSpace(item)
		if ap, err := netip.ParseAddrPort(item); err == nil {
			out = append(out, ap.String())
			continue
		}
		a, err := netip.ParseAddr(item)
		if err != nil {
			return nil, fmt.Errorf("--dns: %q is not an address or address:port", item)
		}
		out = append(out, netip.AddrPortFrom(a.WithZone(""), 53).String())
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--dns: no resolver (and none in %s): workloads could resolve no name", resolvConf)
	}
	return out, nil
}
