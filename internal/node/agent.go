// Package node is Torpor's node agent: it owns a host's worker slots, runs
// actors' workloads in them through a sandbox runtime, checkpoints them to
// snapshot storage (or keeps them on the node) and restores them, serving
// torpor.v1.NodeAgentService to the control plane.
//
// Every mutating call is idempotent on (actor uid, operation id): the
// outcome is recorded durably with the slot's new state, in one write, and
// returned to any retry. A restarted agent adopts the workloads its records
// say are running and removes everything else, so a crash of the agent
// neither leaks a sandbox nor runs one twice.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/httpserve"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/rungroup"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/tracing"
	"github.com/torpor-dev/torpor/internal/validate"
)

// Network gives worker slots their network: a namespace and an address
// each, made ahead of time and kept across agent restarts while workloads
// run, so a workload never waits for its network and an adopted one keeps
// it.
type Network interface {
	// Slot returns the network of slot index, named name, creating it if
	// it does not exist yet.
	Slot(ctx context.Context, name string, index int) (runtime.Slot, error)
}

// Config configures a node agent.
type Config struct {
	// Name of the node (a DNS-1123 label); workers are <name>-w<i>.
	Name string
	// ServerURL is the control plane's base URL.
	ServerURL string
	// Listen is the address to serve the node agent API on; Listener, when
	// set, is used instead.
	Listen   string
	Listener net.Listener
	// GateListen is the address of the slot gate, through which routers
	// reach the workloads (internal/slotgate). Default: where the previous
	// run listened, else the API's host with a port the system picks.
	GateListen string
	// GateCommand runs the slot gate as a process of its own (`torpor
	// node gate`, internal/gateproc), which outlives the agent as the
	// sandboxes do, so an agent's restart cuts no routed connection.
	// Empty: the gate runs inside the agent and dies with it.
	GateCommand []string
	// Advertise is the base URL the control plane reaches this agent at.
	// Default: https://<listen address>, with 127.0.0.1 for an unspecified
	// host.
	Advertise string
	// Workers is the number of worker slots.
	Workers int
	Pool    string
	Labels  map[string]string
	// StateDir holds the agent's records, durable volumes, unpacked images,
	// snapshot cache and local checkpoints.
	StateDir string
	Runtime  runtime.Runtime
	// Snapshots is the snapshot storage shared with the control plane.
	Snapshots snapshot.ObjectStore
	Network   Network
	// CAFingerprint pins the control plane's CA ("sha256:<hex>", printed
	// by `torpor token create`): joining trusts only a server whose chain
	// ends in it, and a saved certificate from another CA is not used.
	CAFingerprint string
	// JoinToken returns a node join token. It is called only when the
	// state directory holds no usable certificate of this node, so a
	// restarted node needs none. See credentials.go.
	JoinToken func(ctx context.Context) (string, error)
	// KubernetesToken, instead of JoinToken on Kubernetes, returns the
	// agent's pod's projected ServiceAccount token: the control plane
	// admits a pod of its node agents' DaemonSet as the Node it runs on.
	KubernetesToken func(ctx context.Context) (string, error)
	Logger          *slog.Logger
	// HeartbeatInterval defaults to 3 s.
	HeartbeatInterval time.Duration
	// CacheBytes bounds the snapshot cache: the unpacked trees of
	// snapshots this node restored or wrote (from storage and local
	// checkpoints alike) that no restore uses now; default 4 GiB. A
	// tree a start spent (the actor's own snapshot) goes at once.
	CacheBytes int64
	// OperationTimeout bounds one operation, so a hung sandbox command
	// fails the operation instead of holding its worker forever; default
	// 5 minutes (readiness probes wait at most their template's timeout
	// within it).
	OperationTimeout time.Duration
	// NoWarm turns off warming workers: by default a worker an actor was
	// suspended or paused out of gets a sandbox made ready for that actor,
	// so its next restore there skips the sandbox's boot (see warm.go).
	NoWarm bool
	// Registry receives the agent's metrics, which it serves at
	// /metrics. Default: a new version.NewRegistry.
	Registry *prometheus.Registry
	// Images says where this node reads images from and with which
	// registry credentials; nil allows none. The control plane checked
	// each template against its own policy, this node checks again.
	Images *image.Policy
	// NoEgress (--egress=false) is the node's ceiling on egress: every
	// workload is enforced Deny, whatever its policy, and its start says
	// so (a warning, and a line in the actor's log).
	NoEgress bool
	// DNS are the upstreams ("ip:port") of the node's resolver, which
	// answers the workloads' queries on the gateway's port 53 with the
	// names their policies allow.
	DNS []string
	// GuestHelper is the statically linked torpor binary the node runs
	// inside sandboxes for the API's file calls (guestfiles.go). Default:
	// the node's own executable.
	GuestHelper string
}

// A runtime or network may hold node-wide parts (runsc's shared namespace
// mount; the bridge, the workers' namespaces and veths, the nftables
// table) that outlive the agent for the workloads it leaves running. An
// agent that stops with no sandbox left releases them, so a node stopped
// for good leaves nothing behind; the next start makes them again.
type (
	releasableRuntime interface {
		Close(ctx context.Context) error
	}
	releasableNetwork interface {
		TeardownAll(ctx context.Context) error
	}
)

const (
	defaultHeartbeat  = 3 * time.Second
	defaultCacheBytes = 4 << 30
	defaultOpTimeout  = 5 * time.Minute
	// controlPlaneTimeout bounds one registration (which holds the idle
	// slots) or heartbeat.
	controlPlaneTimeout = 10 * time.Second
	// opRetention is how long a finished operation's outcome is kept for
	// retries.
	opRetention = 24 * time.Hour
)

// dirs is the layout of the state directory.
type dirs struct {
	slots, ops, volumes, images, cache, local, trees, work string
	// oldLocalCache is where earlier versions cached local checkpoints.
	oldLocalCache string
	// logs holds the actors' logs; output the slots' output FIFOs.
	logs, output string
}

func newDirs(root string) dirs {
	return dirs{
		slots:         filepath.Join(root, "slots"),
		ops:           filepath.Join(root, "ops"),
		volumes:       filepath.Join(root, "volumes"),
		images:        filepath.Join(root, "images"),
		cache:         filepath.Join(root, "cache"),
		local:         filepath.Join(root, "local"),
		trees:         filepath.Join(root, "local-trees"),
		oldLocalCache: filepath.Join(root, "local-cache"),
		work:          filepath.Join(root, "work"),
		logs:          filepath.Join(root, "logs"),
		output:        filepath.Join(root, "output"),
	}
}

// Agent is a node agent: the composition of its parts, each behind the
// few methods the others call.
//
//   - machine, the slot state machine: it moves each worker slot
//     through its phases one operation at a time and settles what a
//     previous agent left (lifecycle.go, ops.go, reconcile.go). The node
//     agent API's edge (agentAPI, edge.go) serves NodeAgentService with
//     its operations and with the data plane's exec, logs and files
//     (dataPlane, dataplane.go). A workload's parts come from images, snapshots,
//     volumeDirs, workload identity and prober.
//   - member is the node's membership of the control plane: its
//     certificate, registration and heartbeats (membership.go). It tells
//     the machine which workloads the control plane gave up on
//     (orphanRemover) and workload identity which records name the
//     workers (workerRecords).
//   - identity mints and renews the certificates of the workloads
//     (identity.go); warm keeps free slots warm (warm.go).
type Agent struct {
	cfg      Config
	log      *slog.Logger
	dirs     dirs
	machine  *slotMachine
	data     *dataPlane
	member   *membership
	identity *workloadIdentity
	warm     *warmer
}

// New checks cfg and returns an agent; Run starts it.
func New(cfg Config) (*Agent, error) {
	if err := validate.Name("name", cfg.Name); err != nil {
		return nil, err
	}
	switch {
	case cfg.ServerURL == "":
		return nil, errors.New("server URL: required")
	case cfg.Listen == "" && cfg.Listener == nil:
		return nil, errors.New("listen address: required")
	case cfg.Workers < 1:
		return nil, fmt.Errorf("workers: %d, want at least 1", cfg.Workers)
	case cfg.StateDir == "":
		return nil, errors.New("state directory: required")
	case cfg.Runtime == nil:
		return nil, errors.New("runtime: required")
	case cfg.Snapshots == nil:
		return nil, errors.New("snapshot storage: required")
	case cfg.Network == nil:
		return nil, errors.New("network: required")
	}
	if err := validate.Labels("labels", cfg.Labels); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = defaultHeartbeat
	}
	if cfg.CacheBytes <= 0 {
		cfg.CacheBytes = defaultCacheBytes
	}
	if cfg.OperationTimeout <= 0 {
		cfg.OperationTimeout = defaultOpTimeout
	}
	stateDir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("state directory %s: %w", cfg.StateDir, err)
	}
	cfg.StateDir = stateDir
	d := newDirs(stateDir)
	log := cfg.Logger.With("node", cfg.Name)
	member := newMembership(cfg, log)
	id := &workloadIdentity{root: filepath.Join(stateDir, identityDir), log: log, workers: member}
	m := newSlotMachine(cfg, log, d, id)
	member.orphans, m.slotsChanged = m, member.slotsChanged
	return &Agent{cfg: cfg, log: log, dirs: d, machine: m, data: newDataPlane(m), member: member, identity: id, warm: m.warm}, nil
}

// WorkerName is the name of a node's i-th worker.
func WorkerName(node string, i int) string { return fmt.Sprintf("%s-w%d", node, i) }

// Run prepares the worker slots (adopting workloads a previous run left
// running), serves the node agent API, registers with the control plane
// and heartbeats until ctx is done. Stopping leaves actors' workloads
// running, so the next Run (of a new Agent; an Agent runs once) adopts
// them; it removes warm sandboxes (the next Run makes them again), and
// with no workload left, the node's network too (see releaseIdle).
func (a *Agent) Run(ctx context.Context) error {
	unlock, err := LockStateDir(a.cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()
	// Work left in the background (sealing local checkpoints) ends
	// before the state directory is let go, on every path out.
	defer a.machine.ops.Wait()
	creds, err := a.member.cert.Credentials(ctx)
	if err != nil {
		return err
	}
	controlPlane := creds.ControlPlaneClient()
	// Last, once nothing calls the control plane any more: a kept
	// connection's goroutines would outlive the agent.
	defer controlPlane.CloseIdleConnections()
	// Workloads outlive the agent; the next one renews their identities
	// and watches them again.
	defer a.identity.stopAll()
	defer a.machine.stopWatching()
	defer a.machine.logs.detachAll()
	// Ended once the loops are, for what runs on after open (a slot held
	// out of service retrying its cleanup) before the stop waits for it.
	ctx, endRun := context.WithCancel(ctx)
	defer endRun()
	nodeService := torporv1connect.NewNodeServiceClient(controlPlane, a.member.serverURL)
	a.machine.exitReports = nodeService
	if err := a.open(ctx); err != nil {
		return err
	}
	a.machine.reportRecorded()
	ln := a.cfg.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", a.cfg.Listen); err != nil {
			return fmt.Errorf("listen on %s: %w", a.cfg.Listen, err)
		}
	}
	address := a.cfg.Advertise
	if address == "" {
		address = advertised(ln.Addr())
	}
	gate, err := openGate(ctx, a.cfg, a.machine.gate, ln.Addr())
	if err != nil {
		ln.Close()
		return err
	}
	a.member.gate = gate
	a.identity.minter = torporv1connect.NewIdentityServiceClient(controlPlane, a.member.serverURL)
	a.log.Info("serving node agent API", "listen", ln.Addr().String(), "address", address, "gate", gate, "workers", len(a.machine.slots), "runtime", a.cfg.Runtime.Class())
	// The loops, stopped in reverse: registration and renewal before the
	// gate, the gate before the API server, which drains its calls.
	loops := rungroup.New(ctx)
	loops.Go("node agent API", func(ctx context.Context) error {
		return httpserve.Serve(ctx, ln, a.handler(creds), creds.ServerTLSConfig())
	})
	loops.Go("slot gate", a.machine.gate.serve)
	loops.Go("certificate renewal", func(ctx context.Context) error {
		a.member.cert.KeepRenewed(ctx, creds)
		return ctx.Err()
	})
	loops.Go("egress refusals", func(ctx context.Context) error {
		return a.machine.egress.reportLoop(ctx, a.cfg.Name, nodeService)
	})
	loops.Go("freeze reports", func(ctx context.Context) error {
		return a.machine.reportFreezes(ctx, nodeService)
	})
	loops.Go("resolver", a.serveResolver)
	if log, ok := a.cfg.Network.(refusalLog); ok {
		loops.Go("egress refusal samples", func(ctx context.Context) error {
			// Without samples the counts still go: logged, not fatal.
			if err := log.Refusals(ctx, a.machine.egress.refused); err != nil {
				a.log.Error("egress refusals are counted but not sampled", "err", err)
			}
			<-ctx.Done()
			return nil
		})
	}
	loops.Go("registration", func(ctx context.Context) error {
		a.member.stayRegistered(ctx, nodeService, address)
		return ctx.Err()
	})
	err = loops.Run(ctx)
	endRun()
	// The server stopped, so did every stream: their pumps end.
	a.data.pumps.Wait()
	// Operations already running finish and record their outcome.
	a.machine.ops.Wait()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	a.warm.discard(stopCtx)
	buildsErr := a.machine.endGoldenBuilds(stopCtx)
	idle, releaseErr := a.releaseIdle(stopCtx)
	gateErr := a.machine.gate.stop(idle)
	return errors.Join(err, buildsErr, releaseErr, gateErr)
}

// stopTimeout bounds removing warm sandboxes and the network at a stop.
const stopTimeout = time.Minute

// releaseIdle gives back the node-wide parts of the runtime and the network
// if no sandbox is left, and says whether none was.
func (a *Agent) releaseIdle(ctx context.Context) (idle bool, err error) {
	left, err := a.cfg.Runtime.Sandboxes(ctx)
	if err != nil {
		return false, fmt.Errorf("stop: list sandboxes: %w", err)
	}
	if len(left) > 0 {
		a.log.Info("stopped; workloads keep running for the next start, and so does the slot gate if it is a process", "sandboxes", len(left))
		return false, nil
	}
	if rt, ok := a.cfg.Runtime.(releasableRuntime); ok {
		if err := rt.Close(ctx); err != nil {
			return true, fmt.Errorf("stop: release the runtime: %w", err)
		}
	}
	if n, ok := a.cfg.Network.(releasableNetwork); ok {
		if err := n.TeardownAll(ctx); err != nil {
			return true, fmt.Errorf("stop: remove the workers' network: %w", err)
		}
	}
	a.log.Info("stopped; no workload was left, so neither is the workers' network nor the slot gate")
	return true, nil
}

// handler serves the node agent API, to the control plane only.
func (a *Agent) handler(creds *identity.Credentials) http.Handler {
	mux := http.NewServeMux()
	api := &agentAPI{life: a.machine, data: a.data}
	path, h := api.handler(connect.WithInterceptors(tracing.Interceptor()))
	mux.Handle(path, onlyControlPlane(creds, h))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("GET /metrics", a.machine.metrics.handler())
	return mux
}

// LockStateDir makes sure one agent at a time owns the state directory:
// two would each take the other's workloads for strays, and `torpor node
// --cleanup` must not remove a running agent's.
func LockStateDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("state directory %s is in use by another node agent", dir)
		}
		return nil, fmt.Errorf("state directory %s: lock: %w", dir, err)
	}
	return func() { f.Close() }, nil
}

// advertised turns a listen address into a base URL a local control plane
// can reach.
func advertised(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "https://" + addr.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "https://" + net.JoinHostPort(host, port)
}

// open lays out the state directory, makes the slots and settles what a
// previous run left.
func (a *Agent) open(ctx context.Context) error {
	d := a.dirs
	for _, dir := range []string{d.slots, d.ops, d.volumes, d.images, d.cache, d.local} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
	}
	if err := os.MkdirAll(d.work, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	sn, err := openSnapshots(ctx, a.cfg.Name, a.log, a.cfg.Snapshots, d, a.cfg.CacheBytes, a.machine.ops.Go)
	if err != nil {
		return err
	}
	a.machine.snapshots = sn
	if err := a.machine.openSlots(ctx, a.cfg.Network, a.cfg.Workers, d.slots); err != nil {
		return err
	}
	a.member.slots, a.warm.slots = a.machine.slots, a.machine.slots
	return a.machine.reconcile(ctx)
}

// Registered is closed once the agent has registered with the control
// plane: from then on its workers can take actors.
func (a *Agent) Registered() <-chan struct{} { return a.member.registered }
