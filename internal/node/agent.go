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
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/httpserve"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/retry"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/snapshot"
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
	Logger    *slog.Logger
	// HeartbeatInterval defaults to 3 s.
	HeartbeatInterval time.Duration
	// CacheBytes bounds each snapshot cache (storage and local); default
	// 4 GiB.
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
	// Images says where this node reads images from and with which
	// registry credentials; nil allows none. The control plane checked
	// each template against its own policy, this node checks again.
	Images *image.Policy
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
	slots, ops, volumes, images, cache, local, localCache, work string
}

func newDirs(root string) dirs {
	return dirs{
		slots:      filepath.Join(root, "slots"),
		ops:        filepath.Join(root, "ops"),
		volumes:    filepath.Join(root, "volumes"),
		images:     filepath.Join(root, "images"),
		cache:      filepath.Join(root, "cache"),
		local:      filepath.Join(root, "local"),
		localCache: filepath.Join(root, "local-cache"),
		work:       filepath.Join(root, "work"),
	}
}

// Agent is a node agent.
type Agent struct {
	cfg         Config
	log         *slog.Logger
	rt          runtime.Runtime
	dirs        dirs
	journal     journal
	probeClient *http.Client

	slots   []*slot
	byName  map[string]*slot
	metrics *metrics
	// renewals renew the certificates of the workloads running here.
	renewals renewals

	storage    snapshot.ObjectStore
	cache      *snapshot.Cache
	local      *snapshot.DirStore
	localCache *snapshot.Cache

	mu       sync.Mutex
	inflight map[opKey]*call
	ops      sync.WaitGroup

	// identityClient calls the control plane's IdentityService as this
	// node (MintCert, MintJWT for the workloads on its workers). Set
	// before the agent serves its API.
	identityClient torporv1connect.IdentityServiceClient
	// workers are the records the control plane answered the latest
	// registration with, by worker name (mint requests name a worker by
	// namespace, name and uid); registered is closed after the first.
	workersMu  sync.Mutex
	workers    map[string]*torporv1.Worker
	registered chan struct{}
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
	a := &Agent{
		cfg:         cfg,
		log:         cfg.Logger.With("node", cfg.Name),
		rt:          cfg.Runtime,
		dirs:        d,
		journal:     journal{dir: d.ops},
		probeClient: newProbeClient(),
		byName:      map[string]*slot{},
		storage:     cfg.Snapshots,
		inflight:    map[opKey]*call{},
		registered:  make(chan struct{}),
	}
	a.metrics = newMetrics(a)
	return a, nil
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
	member := a.member()
	creds, err := member.Credentials(ctx)
	if err != nil {
		return err
	}
	// Workloads outlive the agent; the next one renews their identities.
	defer a.renewals.stopAll()
	if err := a.open(ctx); err != nil {
		return err
	}
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
	controlPlane := creds.ControlPlaneClient()
	a.identityClient = torporv1connect.NewIdentityServiceClient(controlPlane, a.serverURL())
	a.log.Info("serving node agent API", "listen", ln.Addr().String(), "address", address, "workers", len(a.slots), "runtime", a.rt.Class())
	serveCtx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	served := make(chan error, 1)
	go func() { served <- httpserve.Serve(serveCtx, ln, a.handler(creds), creds.ServerTLSConfig()) }()
	go member.KeepRenewed(serveCtx, creds)
	go a.stayRegistered(serveCtx, torporv1connect.NewNodeServiceClient(controlPlane, a.serverURL()), address)
	err = <-served
	// Operations already running finish and record their outcome.
	a.ops.Wait()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	a.discardWarm(stopCtx)
	releaseErr := a.releaseIdle(stopCtx)
	if err != nil {
		return errors.Join(fmt.Errorf("node agent API: %w", err), releaseErr)
	}
	return releaseErr
}

// stopTimeout bounds removing warm sandboxes and the network at a stop.
const stopTimeout = time.Minute

// releaseIdle gives back the node-wide parts of the runtime and the network
// if no sandbox is left.
func (a *Agent) releaseIdle(ctx context.Context) error {
	left, err := a.rt.Sandboxes(ctx)
	if err != nil {
		return fmt.Errorf("stop: list sandboxes: %w", err)
	}
	if len(left) > 0 {
		a.log.Info("stopped; workloads keep running for the next start", "sandboxes", len(left))
		return nil
	}
	if rt, ok := a.rt.(releasableRuntime); ok {
		if err := rt.Close(ctx); err != nil {
			return fmt.Errorf("stop: release the runtime: %w", err)
		}
	}
	if n, ok := a.cfg.Network.(releasableNetwork); ok {
		if err := n.TeardownAll(ctx); err != nil {
			return fmt.Errorf("stop: remove the workers' network: %w", err)
		}
	}
	a.log.Info("stopped; no workload was left, so neither is the workers' network")
	return nil
}

// handler serves the node agent API, to the control plane only.
func (a *Agent) handler(creds *identity.Credentials) http.Handler {
	mux := http.NewServeMux()
	path, h := torporv1connect.NewNodeAgentServiceHandler(service{a})
	mux.Handle(path, onlyControlPlane(creds, h))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("GET /metrics", a.metrics.handler())
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
	for _, dir := range []string{d.slots, d.ops, d.volumes, d.images, d.cache, d.local, d.localCache} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
	}
	if err := os.MkdirAll(d.work, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if err := a.journal.prune(time.Now().Add(-opRetention)); err != nil {
		a.log.Warn("operation journal not pruned", "err", err)
	}
	var err error
	if a.cache, err = snapshot.NewCache(d.cache, a.cfg.CacheBytes, a.storage); err != nil {
		return err
	}
	if a.local, err = snapshot.NewDirStore(d.local); err != nil {
		return err
	}
	if a.localCache, err = snapshot.NewCache(d.localCache, a.cfg.CacheBytes, a.local); err != nil {
		return err
	}
	for i := range a.cfg.Workers {
		name := WorkerName(a.cfg.Name, i)
		rs, err := a.cfg.Network.Slot(ctx, name, i)
		if err != nil {
			return fmt.Errorf("worker %s: network: %w", name, err)
		}
		s := newSlot(rs, filepath.Join(d.slots, name+".json"))
		if err := s.load(); err != nil {
			return err
		}
		a.slots = append(a.slots, s)
		a.byName[name] = s
	}
	if err := a.pruneStages(); err != nil {
		return err
	}
	return a.reconcile(ctx)
}

// pruneStages removes the checkpoint stage directories of a previous run
// but those of the captures its slot records claim: the retries of the
// others capture again.
func (a *Agent) pruneStages() error {
	claimed := map[string]bool{}
	for _, s := range a.slots {
		if rec := s.current(); rec.Capture != "" {
			claimed[a.stageDir(rec.ActorUID, rec.Capture)] = true
		}
	}
	actors, err := os.ReadDir(a.dirs.work)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	var errs []error
	for _, actor := range actors {
		dir := filepath.Join(a.dirs.work, actor.Name())
		stages, _ := os.ReadDir(dir)
		for _, st := range stages {
			if path := filepath.Join(dir, st.Name()); !claimed[path] {
				errs = append(errs, os.RemoveAll(path))
			}
		}
		if err := os.Remove(dir); err != nil && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("state directory: checkpoint stages: %w", err)
	}
	return nil
}

func (a *Agent) slot(worker string) (*slot, error) {
	if s := a.byName[worker]; s != nil {
		return s, nil
	}
	if worker == "" {
		return nil, invalid("op.worker", "required")
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("worker %s is not on node %s", worker, a.cfg.Name))
}

func (a *Agent) volumeRoot(actorUID string) string { return filepath.Join(a.dirs.volumes, actorUID) }

// reconcile makes the runtime's sandboxes agree with the slot records: a
// workload recorded running is adopted, a capture recorded begun is
// adopted as running if its sandbox still runs and kept for its retry
// otherwise, and anything else (an operation cut short by a crash, a
// sandbox no record knows) is removed, with its volumes.
func (a *Agent) reconcile(ctx context.Context) error {
	names, err := a.rt.Sandboxes(ctx)
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	present := map[string]bool{}
	for _, n := range names {
		present[n] = true
	}
	for _, s := range a.slots {
		rec := s.current()
		if last := rec.LastOp; last != nil {
			if j, err := a.journal.get(last.key()); err == nil && j == nil {
				if err := a.journal.put(last); err != nil {
					return err
				}
			}
		}
		log := a.log.With("worker", s.name(), "actor_uid", rec.ActorUID, "phase", string(rec.Phase))
		switch {
		case rec.Phase == phaseRunning && present[s.name()]:
			log.Info("adopted running workload", "operation", rec.Operation)
			a.adoptIdentity(s, rec)
		case rec.Capture != "":
			if err := a.settleCapture(ctx, s, rec, present[s.name()]); err != nil {
				return err
			}
		case rec.ActorUID != "":
			log.Warn("workload did not survive the agent's restart; removing it")
			if err := a.vacate(ctx, s, rec); err != nil {
				return err
			}
			if err := s.commit(nil); err != nil {
				return err
			}
		case a.keepOrRewarm(ctx, s, present[s.name()]):
		case present[s.name()]:
			log.Warn("removing a sandbox no record knows")
			if err := a.rt.Terminate(ctx, s.rt); err != nil {
				return fmt.Errorf("worker %s: remove unknown sandbox: %w", s.name(), err)
			}
		}
		delete(present, s.name())
	}
	for name := range present {
		a.log.Warn("removing the sandbox of a worker this node no longer has", "worker", name)
		if err := a.rt.Terminate(ctx, runtime.Slot{Name: name}); err != nil {
			return fmt.Errorf("worker %s: remove sandbox: %w", name, err)
		}
	}
	return a.removeStrayVolumes()
}

// settleCapture settles a slot whose checkpoint operation began before
// the agent restarted: a sandbox still running that has not begun saving
// itself never will, so the workload is adopted and the retry captures
// again; a sandbox saving itself, or gone (it finished or abandoned the
// capture), leaves the slot to the retry to go on from the stage
// directory (or to a Terminate, or registration finding the actor placed
// elsewhere, to remove), with the actor's volumes.
func (a *Agent) settleCapture(ctx context.Context, s *slot, rec slotRecord, present bool) error {
	log := a.log.With("worker", s.name(), "actor_uid", rec.ActorUID, "operation", rec.Capture)
	if present {
		st, err := a.rt.Stats(ctx, s.rt)
		if err != nil {
			return fmt.Errorf("worker %s: %w", s.name(), err)
		}
		if st.Running && !captureBegun(a.stageDir(rec.ActorUID, rec.Capture)) {
			rec.Phase, rec.Capture = phaseRunning, ""
			s.stage(rec)
			if err := s.commit(nil); err != nil {
				return err
			}
			log.Info("adopted a workload whose checkpoint was cut short; its retry captures it again")
			a.adoptIdentity(s, rec)
			return nil
		}
		if st.Running {
			log.Info("the workload is saving itself for a checkpoint cut short; kept for its retry")
			return nil
		}
		// What a sandbox that captured itself leaves.
		if err := a.rt.Terminate(ctx, s.rt); err != nil {
			return fmt.Errorf("worker %s: remove the sandbox that checkpointed actor %s: %w", s.name(), rec.ActorUID, err)
		}
	}
	log.Info("kept the capture of a checkpoint cut short for its retry")
	return nil
}

// captureBegun says whether the sandbox began writing its memory image
// into stage: runsc creates the image files empty before it asks the
// sandbox to save itself.
func captureBegun(stage string) bool {
	files, _ := os.ReadDir(filepath.Join(stage, memoryDir))
	for _, f := range files {
		if fi, err := f.Info(); err == nil && fi.Size() > 0 {
			return true
		}
	}
	return false
}

// removeStrayVolumes deletes the volume directories of actors no slot
// hosts: an operation that crashed before recording left them.
func (a *Agent) removeStrayVolumes() error {
	entries, err := os.ReadDir(a.dirs.volumes)
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	hosted := map[string]bool{}
	for _, s := range a.slots {
		hosted[s.current().ActorUID] = true
	}
	var errs []error
	for _, e := range entries {
		if hosted[e.Name()] {
			continue
		}
		a.log.Info("removing volumes of an actor no worker hosts", "actor_uid", e.Name())
		errs = append(errs, os.RemoveAll(filepath.Join(a.dirs.volumes, e.Name())))
	}
	return errors.Join(errs...)
}

// stayRegistered registers the node and its workers, then heartbeats; a
// control plane that lost the node (or was unreachable) gets it again.
func (a *Agent) stayRegistered(ctx context.Context, client torporv1connect.NodeServiceClient, address string) {
	registered := false
	backoff := retry.Policy{Initial: 100 * time.Millisecond, Max: a.cfg.HeartbeatInterval}.Start()
	for {
		// A control plane that does not answer must not stall the loop.
		callCtx, cancel := context.WithTimeout(ctx, controlPlaneTimeout)
		if !registered {
			if err := a.register(callCtx, client, address); err != nil {
				a.log.Warn("registration with the control plane failed; retrying", "server", a.cfg.ServerURL, "err", err)
			} else {
				registered = true
			}
		} else if _, err := client.Heartbeat(callCtx, connect.NewRequest(&torporv1.HeartbeatRequest{Node: a.cfg.Name})); err != nil {
			a.log.Warn("heartbeat failed", "server", a.cfg.ServerURL, "err", err)
			registered = connect.CodeOf(err) != connect.CodeNotFound
		}
		cancel()
		if !registered {
			if !backoff.Wait(ctx) {
				return
			}
			continue
		}
		backoff.Reset()
		select {
		case <-ctx.Done():
			return
		case <-time.After(a.cfg.HeartbeatInterval):
		}
	}
}

func (a *Agent) register(ctx context.Context, client torporv1connect.NodeServiceClient, address string) error {
	class := a.rt.Class()
	req := &torporv1.RegisterNodeRequest{Node: &torporv1.Node{
		Metadata:       &torporv1.ObjectMeta{Name: a.cfg.Name, Labels: a.cfg.Labels},
		Address:        address,
		SandboxClasses: []string{class},
	}}
	for _, s := range a.slots {
		req.Workers = append(req.Workers, &torporv1.Worker{
			Metadata: &torporv1.ObjectMeta{Name: s.name(), Space: validate.WorkerNamespace, Labels: a.cfg.Labels},
			Spec:     &torporv1.WorkerSpec{Node: a.cfg.Name, Ip: s.rt.IP, Pool: a.cfg.Pool, SandboxClass: class},
		})
	}
	// Idle slots stay locked until the placements read by this call are
	// applied, so nothing is placed on them in between. A slot busy with
	// an operation is left to it.
	var idle []*slot
	for _, s := range a.slots {
		if s.tryLock() {
			idle = append(idle, s)
		}
	}
	defer func() {
		for _, s := range idle {
			s.unlock()
		}
	}()
	resp, err := client.RegisterNode(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	a.recordWorkers(resp.Msg.GetWorkers())
	a.log.Info("registered with the control plane", "server", a.cfg.ServerURL, "workers", len(resp.Msg.GetWorkers()))
	a.dropOrphans(ctx, idle, resp.Msg.GetWorkers())
	return nil
}

// recordWorkers keeps the control plane's records of this node's workers.
func (a *Agent) recordWorkers(workers []*torporv1.Worker) {
	byName := make(map[string]*torporv1.Worker, len(workers))
	for _, w := range workers {
		a.log.Debug("worker registered", "worker", w.GetMetadata().GetName(), "uid", w.GetMetadata().GetUid())
		byName[w.GetMetadata().GetName()] = w
	}
	a.workersMu.Lock()
	defer a.workersMu.Unlock()
	a.workers = byName
	select {
	case <-a.registered:
	default:
		close(a.registered)
	}
}

// registeredWorker returns the control plane's record of a worker of this
// node (its namespace and uid name it in mint requests). A restarted agent
// may be asked to run a workload before it registered again, so this
// waits for the first registration, as long as ctx allows.
func (a *Agent) registeredWorker(ctx context.Context, worker string) (*torporv1.Worker, error) {
	select {
	case <-a.registered:
	case <-ctx.Done():
		return nil, fmt.Errorf("worker %s: the node has not registered with the control plane yet: %w", worker, ctx.Err())
	}
	a.workersMu.Lock()
	defer a.workersMu.Unlock()
	w, ok := a.workers[worker]
	if !ok {
		return nil, fmt.Errorf("worker %s: the control plane did not register it", worker)
	}
	return w, nil
}

// dropOrphans removes the workloads of slots (locked by the caller) that
// the control plane no longer places on their worker: it gave up on them
// while this node was out of touch (the actor crashed and may run
// elsewhere by now), and would otherwise find the worker busy forever. A
// worker returned without a status (a registry that does not track
// placement) says nothing.
func (a *Agent) dropOrphans(ctx context.Context, slots []*slot, workers []*torporv1.Worker) {
	placed := map[string]*torporv1.WorkerStatus{}
	for _, w := range workers {
		placed[w.GetMetadata().GetName()] = w.GetStatus()
	}
	for _, s := range slots {
		cur, status := s.current(), placed[s.name()]
		if cur.ActorUID == "" || status == nil || status.GetActor().GetUid() == cur.ActorUID {
			continue
		}
		a.log.Warn("the control plane no longer places this workload here; removing it", "worker", s.name(), "actor_uid", cur.ActorUID, "placed", status.GetActor().GetUid())
		err := a.vacate(ctx, s, cur)
		if err == nil {
			err = s.commit(nil)
		}
		if err != nil {
			a.log.Error("removing an orphaned workload", "worker", s.name(), "actor_uid", cur.ActorUID, "err", err)
		}
	}
}

// Registered is closed once the agent has registered with the control
// plane: from then on its workers can take actors.
func (a *Agent) Registered() <-chan struct{} { return a.registered }
