// Package e2e runs Torpor end to end on its real parts: the control plane
// on SQLite or PostgreSQL, node agents with gVisor sandboxes in their own
// network namespaces, the router, over real HTTP.
package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/gateproc"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/node"
	"github.com/torpor-dev/torpor/internal/router"
	"github.com/torpor-dev/torpor/internal/runtime/gvisor"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/server"
	"github.com/torpor-dev/torpor/internal/slotgate"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/snapshot/s3test"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/version"
)

// backends are the stores every lifecycle test runs on.
var backends = []string{"sqlite", "postgres"}

type clusterOptions struct {
	backend          string
	nodes            int
	workersPerNode   int
	heartbeatTimeout time.Duration
	parkTimeout      time.Duration
	// s3 keeps snapshots in S3-compatible storage (a real server,
	// s3test) instead of a local directory.
	s3 bool
	// egress lets workloads reach beyond their node.
	egress bool
	// dns are the upstreams of the nodes' resolvers.
	dns []string
	// storeURL, when set, is the store instead of a fresh one of backend.
	storeURL string
	// headroom is, per worker pool, the workers the control plane keeps
	// free by evicting early.
	headroom map[string]int
	// nodeMemoryFloor is the control plane's --node-memory-floor (0: the
	// engine's off).
	nodeMemoryFloor int
}

// cluster is a control plane, its node agents and a router.
type cluster struct {
	t      testing.TB
	ctx    context.Context
	store  store.Store
	server *server.Server
	api    string
	// snapshotStorage is the snapshot storage's location (a directory or an
	// s3:// location), objects the store at it.
	snapshotStorage string
	objects         snapshot.ObjectStore
	// egress: node agents let workloads reach beyond them.
	egress  bool
	dns     []string
	nodes   []*nodeAgent
	router  *router.Router
	ingress string
	// conn reaches the API as the admin (the CA to verify it with and the
	// admin token); http is its client.
	conn client.Connection
	http *http.Client

	actors    torporv1connect.ActorServiceClient
	templates torporv1connect.TemplateServiceClient
	workers   torporv1connect.WorkerServiceClient
	snapshots torporv1connect.SnapshotServiceClient
}

// nodeAgent is one in-process node agent on real gVisor.
type nodeAgent struct {
	name    string
	agent   *node.Agent
	runtime *gvisor.Runtime
	network *netns.Network
	// metrics is the agent's registry (its /metrics), for benchmarks
	// that break operations into the agent's steps.
	metrics *prometheus.Registry
	// state is the agent's state directory (its snapshot cache, local
	// checkpoints, images and sandboxes' bundles).
	state   string
	workers int
	stop    context.CancelFunc
	done    chan struct{}
}

func newCluster(t testing.TB, opts clusterOptions) *cluster {
	t.Helper()
	runtimetest.RequireRoot(t)
	if opts.nodes == 0 {
		opts.nodes = 1
	}
	if opts.workersPerNode == 0 {
		opts.workersPerNode = 2
	}
	ctx := context.Background()
	c := &cluster{t: t, ctx: ctx, egress: opts.egress, dns: opts.dns}
	var err error
	if opts.storeURL == "" {
		opts.storeURL = storetest.URL(t, opts.backend)
	}
	c.snapshotStorage = t.TempDir()
	if opts.s3 {
		c.snapshotStorage = s3test.Location(t, "torpor")
	}
	logger := testLogger()
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp, err := server.Start(ctx, server.Options{Listener: apiLn, Store: opts.storeURL, Snapshots: c.snapshotStorage,
		Logger: logger, HeartbeatTimeout: opts.heartbeatTimeout, RecoverAfter: time.Minute, Images: runtimetest.ImagePolicy(t), Headroom: opts.headroom, NodeMemoryFloor: opts.nodeMemoryFloor})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop the control plane: %v", err)
		}
	})
	c.store, c.objects, c.server, c.api = cp.Store, cp.Objects, cp.Server, cp.URL
	c.connect(client.Connection{Server: c.api, CA: cp.CAPEM, Token: cp.AdminToken})

	for range opts.nodes {
		c.addNode(opts.workersPerNode)
	}
	// The router is an API client of its own, over mutual TLS.
	c.router, err = router.New(router.Config{Server: c.api, HTTPClient: c.joinRouter("e2e-router"), Logger: logger, ParkTimeout: opts.parkTimeout})
	if err != nil {
		t.Fatal(err)
	}
	ingress := httptest.NewServer(c.router)
	t.Cleanup(ingress.Close)
	c.ingress = ingress.URL
	routerCtx, stopRouter := context.WithCancel(ctx)
	go c.router.Run(routerCtx) //nolint:errcheck // ends with the test
	t.Cleanup(stopRouter)
	return c
}

// connect sets the API clients of c to conn.
func (c *cluster) connect(conn client.Connection) {
	c.t.Helper()
	hc, err := conn.HTTPClient()
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(hc.CloseIdleConnections)
	c.conn, c.http = conn, hc
	c.actors = torporv1connect.NewActorServiceClient(hc, conn.Server)
	c.templates = torporv1connect.NewTemplateServiceClient(hc, conn.Server)
	c.workers = torporv1connect.NewWorkerServiceClient(hc, conn.Server)
	c.snapshots = torporv1connect.NewSnapshotServiceClient(hc, conn.Server)
}

// joinToken makes a join token for node through the API, as an admin
// does, and returns it with the CA fingerprint the node must pin.
func (c *cluster) joinToken(node string) (token, caFingerprint string) {
	c.t.Helper()
	return c.createJoinToken(&torporv1.CreateTokenRequest{Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_NODE_JOIN, Name: node})
}

func (c *cluster) createJoinToken(req *torporv1.CreateTokenRequest) (token, caFingerprint string) {
	c.t.Helper()
	resp, err := torporv1connect.NewIdentityServiceClient(c.http, c.api).CreateToken(c.ctx, connect.NewRequest(req))
	if err != nil {
		c.t.Fatalf("join token for %s: %v", req.GetName(), err)
	}
	return resp.Msg.GetToken(), resp.Msg.GetCaFingerprint()
}

// joinRouter joins router client name (role router, every space) as
// torpor router does, and returns its client of the API.
func (c *cluster) joinRouter(name string) *http.Client {
	c.t.Helper()
	token, fingerprint := c.createJoinToken(&torporv1.CreateTokenRequest{
		Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_CLIENT_JOIN, Name: name, Role: torporv1.ClientRole_CLIENT_ROLE_ROUTER,
	})
	m := &identity.Member{
		Kind: identity.MemberClient, Name: name, ServerURL: c.api, File: filepath.Join(c.t.TempDir(), "router-credentials.json"),
		CAFingerprint: fingerprint, JoinToken: func(context.Context) (string, error) { return token, nil }, Logger: testLogger(),
	}
	creds, err := m.Credentials(c.ctx)
	if err != nil {
		c.t.Fatalf("router %s joins: %v", name, err)
	}
	hc := creds.ControlPlaneClient()
	c.t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// addNode starts a node agent with its own bridge and subnet, so tests
// (and test packages) running at once never share a network.
func (c *cluster) addNode(workers int) *nodeAgent {
	t := c.t
	t.Helper()
	suffix := randomHex(3)
	n := &nodeAgent{name: "e2e-" + suffix, workers: workers, done: make(chan struct{}), metrics: version.NewRegistry()}
	var err error
	n.network, err = netns.New(netns.Config{Node: n.name, Bridge: "te" + suffix, CIDR: fmt.Sprintf("10.%d.%d.0/24", 232+mrand.IntN(16), mrand.IntN(256)), Egress: c.egress})
	if err != nil {
		t.Fatal(err)
	}
	state := shortTempDir(t)
	n.state = state
	n.runtime, err = gvisor.New(gvisor.Config{ConfigureNetwork: netns.Configure, Runsc: runtimetest.Runsc(t), RootDir: filepath.Join(state, "gvisor")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	token, fingerprint := c.joinToken(n.name)
	n.agent, err = node.New(node.Config{
		Name: n.name, ServerURL: c.api, Listener: ln, Workers: workers, Pool: "default",
		StateDir: state, Runtime: n.runtime, Snapshots: c.objects, Network: n.network, DNS: c.dns,
		CAFingerprint: fingerprint, JoinToken: func(context.Context) (string, error) { return token, nil },
		HeartbeatInterval: 200 * time.Millisecond,
		Registry:          n.metrics,
		Logger:            testLogger(),
		Images:            runtimetest.ImagePolicy(t),
		GuestHelper:       torporBinary(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(c.ctx)
	n.stop = stop
	go func() {
		defer close(n.done)
		if err := n.agent.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("node agent %s: %v", n.name, err)
		}
	}()
	t.Cleanup(func() { n.shutdown(t) })
	c.nodes = append(c.nodes, n)
	c.waitFor("node "+n.name+" registered", func() bool {
		resp, err := c.workers.ListWorkers(c.ctx, connect.NewRequest(&torporv1.ListRequest{}))
		if err != nil {
			return false
		}
		count := 0
		for _, w := range resp.Msg.GetWorkers() {
			if w.GetSpec().GetNode() == n.name {
				count++
			}
		}
		return count == workers
	})
	return n
}

// shutdown stops the agent and removes every sandbox and network it made.
func (n *nodeAgent) shutdown(t testing.TB) {
	n.stop()
	<-n.done
	ctx := context.Background()
	// As torpor node --cleanup does: a frozen sandbox is thawed first.
	if _, err := slotgate.ThawMarked(ctx, gateproc.FreezeMarks(n.state), func(c string) slotgate.Pauser { return gvisor.Pauser(c) }); err != nil {
		t.Errorf("thaw what %s left frozen: %v", n.name, err)
	}
	for i := range n.workers {
		slot, err := n.network.Slot(ctx, node.WorkerName(n.name, i), i)
		if err == nil {
			err = n.runtime.Terminate(ctx, slot)
		}
		if err != nil {
			t.Errorf("clean up worker %d of %s: %v", i, n.name, err)
		}
	}
	if err := n.runtime.Close(ctx); err != nil {
		t.Errorf("close runtime of %s: %v", n.name, err)
	}
	if err := n.network.TeardownAll(ctx); err != nil {
		t.Errorf("tear down network of %s: %v", n.name, err)
	}
}

// shortTempDir is a temporary directory with a short path: runsc's control
// sockets live under it and a socket path must fit in 107 bytes.
func shortTempDir(t testing.TB) string {
	dir, err := os.MkdirTemp("", "te")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// counterTemplate is the counter example's template on the local image.
func counterTemplate(t testing.TB, name string, change func(*torporv1.TemplateSpec)) *torporv1.Template {
	spec := &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers: []*torporv1.Container{{
			Name:           "counter",
			Image:          runtimetest.CounterImage(t),
			Command:        []string{"/counter"},
			Env:            []*torporv1.EnvVar{{Name: "PORT", Value: "8080"}},
			ReadinessProbe: &torporv1.Probe{HttpGet: &torporv1.HTTPGetAction{Path: "/readyz", Port: 8080}, TimeoutSeconds: 30},
			Mounts:         []*torporv1.Mount{{Volume: "data", Path: "/data"}},
		}},
		Volumes: []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
	}
	if change != nil {
		change(spec)
	}
	return &torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: name}, Spec: spec}
}

// applyTemplate creates t and waits for its golden snapshot.
func (c *cluster) applyTemplate(tmpl *torporv1.Template) *torporv1.Template {
	c.t.Helper()
	if _, err := c.templates.CreateTemplate(c.ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tmpl})); err != nil {
		c.t.Fatal(err)
	}
	var got *torporv1.Template
	c.waitFor("golden snapshot of "+tmpl.GetMetadata().GetName(), func() bool {
		resp, err := c.templates.GetTemplate(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: tmpl.GetMetadata().GetName()}))
		if err != nil {
			c.t.Fatal(err)
		}
		got = resp.Msg
		if got.GetStatus().GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED {
			c.t.Fatalf("golden build failed: %s", got.GetStatus().GetMessage())
		}
		return got.GetStatus().GetPhase() == torporv1.TemplatePhase_TEMPLATE_PHASE_READY
	})
	return got
}

func (c *cluster) createActor(name, template string) {
	c.t.Helper()
	if _, err := c.actors.CreateActor(c.ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: name}, Spec: &torporv1.ActorSpec{Template: template},
	}})); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) actor(name string) *torporv1.Actor {
	c.t.Helper()
	resp, err := c.actors.GetActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: name}))
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.Msg
}

func (c *cluster) resume(name string, req *torporv1.ResumeActorRequest) (*torporv1.Actor, error) {
	if req == nil {
		req = &torporv1.ResumeActorRequest{}
	}
	req.Space, req.Name = "default", name
	resp, err := c.actors.ResumeActor(c.ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (c *cluster) mustResume(name string) *torporv1.Actor {
	c.t.Helper()
	a, err := c.resume(name, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	return a
}

func (c *cluster) step(name string, rpc func(context.Context, *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error)) *torporv1.Actor {
	c.t.Helper()
	resp, err := rpc(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: name}))
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.Msg
}

func (c *cluster) suspend(name string) *torporv1.Actor { return c.step(name, c.actors.SuspendActor) }
func (c *cluster) pause(name string) *torporv1.Actor   { return c.step(name, c.actors.PauseActor) }

func (c *cluster) events(name string) []*torporv1.ActorEvent {
	c.t.Helper()
	resp, err := c.actors.ListActorEvents(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: name}))
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.Msg.GetEvents()
}

// get sends one request straight to the actor's worker.
func get(t *testing.T, a *torporv1.Actor) string {
	t.Helper()
	resp, err := http.Get("http://" + net.JoinHostPort(a.GetStatus().GetWorker().GetIp(), "8080") + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET worker %s: %s %s", a.GetStatus().GetWorker().GetName(), resp.Status, body)
	}
	return strings.TrimSpace(string(body))
}

// waitFor polls cond until it holds, failing the test after a minute.
func (c *cluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testLogger shows warnings and errors of the parts under test; the
// background loops outlive a test's log, so it writes to stderr.
func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
