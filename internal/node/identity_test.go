package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/runtime"
	"github.com/torpor-dev/torpor/internal/runtime/fake"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/validate"
)

// MintCert grants a node the certificate of the workload on a worker it
// registers (named and uid'd as RegisterNode answers). The registry keeps
// no placements, so it names the actor the way fakeNode.workload does;
// authorization by placement is tested on authorizingPlane.
func (r *registry) MintCert(ctx context.Context, req *connect.Request[torporv1.MintCertRequest]) (*connect.Response[torporv1.IssuedCertificate], error) {
	node, ok := identity.CallerNode(ctx)
	if !ok {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("a node certificate is required"))
	}
	c := req.Msg.GetWorkload()
	if c.GetWorkerNamespace() != validate.WorkerNamespace || !strings.HasPrefix(c.GetWorkerName(), node+"-w") || c.GetWorkerUid() != "uid-"+c.GetWorkerName() {
		return nil, connect.NewError(connect.CodePermissionDenied, identity.ErrDenied)
	}
	w := identity.Workload{Space: "s", Actor: "actor-" + c.GetActorUid(), ActorUID: c.GetActorUid()}
	return issueWorkload(r.ca, w, req.Msg.GetCsr())
}

func issueWorkload(ca *identity.Authority, w identity.Workload, csr []byte) (*connect.Response[torporv1.IssuedCertificate], error) {
	issued, err := ca.IssueWorkloadCertificate(w, csr)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return connect.NewResponse(&torporv1.IssuedCertificate{
		CertificateChain: issued.Chain, TrustBundle: ca.TrustBundle(), SpiffeId: issued.SPIFFEID, ExpireTime: timestamppb.New(issued.Certificate.NotAfter),
	}), nil
}

// authorizingPlane is a control plane that keeps workers and actors in a
// real SQLite store and mints as the server does: authorized by
// identity.AuthorizeWorkload, signed by an identity.Authority whose keys
// are in that store. It serves the registry's TLS (node certificates are
// the registry's), so startAgent's client and join work unchanged.
type authorizingPlane struct {
	*registry
	store     store.Store
	authority *identity.Authority
	mints     atomic.Int64
}

func newAuthorizingPlane(t *testing.T, workloadTTL time.Duration) *authorizingPlane {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, storetest.URL(t, "sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	authority, err := identity.Load(ctx, st, identity.Config{WorkloadCertTTL: workloadTTL})
	if err != nil {
		t.Fatal(err)
	}
	p := &authorizingPlane{registry: newRegistry(t), store: st, authority: authority}
	mux := http.NewServeMux()
	mux.Handle(torporv1connect.NewNodeServiceHandler(p))
	mux.Handle(torporv1connect.NewIdentityServiceHandler(p))
	// As newRegistry serves (not httptest's StartTLS, which answers
	// clients that send no server name with a certificate of its own).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: identity.CallerMiddleware(p.ca.TrustDomain(), mux), TLSConfig: identity.ServerTLSConfig(p.serverCert, p.roots),
		ErrorLog: log.New(io.Discard, "", 0)}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	p.url = "https://" + ln.Addr().String()
	return p
}

// RegisterNode records the node's workers in the store (once; their
// records, placements included, are answered from there).
func (p *authorizingPlane) RegisterNode(ctx context.Context, req *connect.Request[torporv1.RegisterNodeRequest]) (*connect.Response[torporv1.RegisterNodeResponse], error) {
	resp := &torporv1.RegisterNodeResponse{Node: req.Msg.GetNode()}
	for _, w := range req.Msg.GetWorkers() {
		m := w.GetMetadata()
		got, err := p.store.Workers().Get(ctx, m.GetSpace(), m.GetName())
		if errors.Is(err, store.ErrNotFound) {
			w.Status = &torporv1.WorkerStatus{}
			got, err = p.store.Workers().Create(ctx, w)
		}
		if err != nil {
			return nil, err
		}
		resp.Workers = append(resp.Workers, got)
	}
	return connect.NewResponse(resp), nil
}

func (p *authorizingPlane) Heartbeat(context.Context, *connect.Request[torporv1.HeartbeatRequest]) (*connect.Response[torporv1.HeartbeatResponse], error) {
	return connect.NewResponse(&torporv1.HeartbeatResponse{HeartbeatTime: timestamppb.Now()}), nil
}

func (p *authorizingPlane) MintCert(ctx context.Context, req *connect.Request[torporv1.MintCertRequest]) (*connect.Response[torporv1.IssuedCertificate], error) {
	node, ok := identity.CallerNode(ctx)
	if !ok {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("a node certificate is required"))
	}
	c := req.Msg.GetWorkload()
	w, err := identity.AuthorizeWorkload(ctx, identity.Records{Worker: p.store.Workers().Get, Actor: p.store.Actors().Get}, node, identity.WorkloadClaim{
		WorkerNamespace: c.GetWorkerNamespace(), WorkerName: c.GetWorkerName(), WorkerUID: c.GetWorkerUid(), ActorUID: c.GetActorUid(),
	})
	if errors.Is(err, identity.ErrDenied) {
		return nil, connect.NewError(connect.CodePermissionDenied, identity.ErrDenied)
	}
	if err != nil {
		return nil, err
	}
	p.mints.Add(1)
	return issueWorkload(p.authority, w, req.Msg.GetCsr())
}

// place points actor actorUID (created if new, named as fakeNode.workload
// names it) and worker at each other in one transaction, as a resume
// does; worker "" only takes the actor off its worker.
func (p *authorizingPlane) place(t *testing.T, actorUID, worker string) {
	t.Helper()
	ctx := context.Background()
	name := "actor-" + actorUID
	err := p.store.InTx(ctx, func(tx store.Tx) error {
		a, err := tx.Actors().Get(ctx, "s", name)
		if errors.Is(err, store.ErrNotFound) {
			a, err = tx.Actors().Create(ctx, &torporv1.Actor{
				Metadata: &torporv1.ObjectMeta{Space: "s", Name: name, Uid: actorUID},
				Spec:     &torporv1.ActorSpec{Template: "app"},
				Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED},
			})
		}
		if err != nil {
			return err
		}
		if prev := a.GetStatus().GetWorker(); prev != nil {
			w, err := tx.Workers().Get(ctx, prev.GetNamespace(), prev.GetName())
			if err != nil {
				return err
			}
			w.Status = &torporv1.WorkerStatus{}
			if _, err := tx.Workers().Update(ctx, w); err != nil {
				return err
			}
		}
		a.Status.Worker, a.Status.State = nil, torporv1.ActorState_ACTOR_STATE_SUSPENDED
		if worker != "" {
			w, err := tx.Workers().Get(ctx, validate.WorkerNamespace, worker)
			if err != nil {
				return err
			}
			wm := w.GetMetadata()
			w.Status = &torporv1.WorkerStatus{Actor: &torporv1.ActorRef{Space: "s", Name: name, Uid: actorUID}}
			a.Status.Worker = &torporv1.WorkerRef{Namespace: wm.GetSpace(), Name: wm.GetName(), Uid: wm.GetUid(), Node: w.GetSpec().GetNode(), Ip: w.GetSpec().GetIp()}
			a.Status.State = torporv1.ActorState_ACTOR_STATE_RESUMING
			if _, err := tx.Workers().Update(ctx, w); err != nil {
				return err
			}
		}
		_, err = tx.Actors().Update(ctx, a)
		return err
	})
	if err != nil {
		t.Fatalf("place actor %s on worker %q: %v", actorUID, worker, err)
	}
}

// identityWitness is the fake runtime, looking into the identity
// directory of each sandbox as it starts: what the workload would find.
type identityWitness struct {
	*fake.Runtime
	mu   sync.Mutex
	seen []startedIdentity
}

type startedIdentity struct {
	method, slot, actorUID string
	mounted                bool
	// files by name, with the key file's mode.
	files   map[string][]byte
	keyMode os.FileMode
}

func (w *identityWitness) Run(ctx context.Context, slot runtime.Slot, wl runtime.Workload) error {
	w.look("Run", slot, wl)
	return w.Runtime.Run(ctx, slot, wl)
}

func (w *identityWitness) Restore(ctx context.Context, slot runtime.Slot, wl runtime.Workload, imageDir string) error {
	w.look("Restore", slot, wl)
	return w.Runtime.Restore(ctx, slot, wl, imageDir)
}

func (w *identityWitness) look(method string, slot runtime.Slot, wl runtime.Workload) {
	s := startedIdentity{method: method, slot: slot.Name, actorUID: wl.ActorUID, files: map[string][]byte{}}
	dir, mounted := wl.ExtraMounts[IdentityMountPath]
	s.mounted = mounted
	if entries, err := os.ReadDir(dir); mounted && err == nil {
		for _, e := range entries {
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				continue
			}
			s.files[e.Name()] = data
			if e.Name() == IdentityKeyFile {
				if fi, err := e.Info(); err == nil {
					s.keyMode = fi.Mode().Perm()
				}
			}
		}
	}
	w.mu.Lock()
	w.seen = append(w.seen, s)
	w.mu.Unlock()
}

// last is what the latest start of actorUID found.
func (w *identityWitness) last(t *testing.T, actorUID string) startedIdentity {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.seen) - 1; i >= 0; i-- {
		if w.seen[i].actorUID == actorUID {
			return w.seen[i]
		}
	}
	t.Fatalf("actor %s never started", actorUID)
	return startedIdentity{}
}

// newIdentityNode is a fake node joined to plane, its runtime watched.
func newIdentityNode(t *testing.T, plane *authorizingPlane) (*fakeNode, *identityWitness) {
	t.Helper()
	objects, err := snapshot.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	witness := &identityWitness{Runtime: fake.New()}
	n := &fakeNode{name: "n1", rt: witness.Runtime, net: loopback{int(loopbackNets.Add(1))%200 + 20}, registry: plane.registry, tmpl: appTemplate(t)}
	n.cfg = Config{
		Name: n.name, Workers: 2, Pool: "p", StateDir: t.TempDir(), Runtime: witness, Snapshots: objects, Network: n.net,
		HeartbeatInterval: 20 * time.Millisecond, Images: runtimetest.ImagePolicy(t),
	}
	plane.join(t, &n.cfg)
	n.start(t)
	waitFor(t, "the workers to be registered", func() bool {
		_, err := plane.store.Workers().Get(context.Background(), validate.WorkerNamespace, n.worker(n.cfg.Workers-1))
		return err == nil
	})
	return n, witness
}

func (n *fakeNode) identityDir(worker int) string {
	return filepath.Join(n.cfg.StateDir, identityDir, n.worker(worker))
}

// hostIdentity reads worker's identity files on the host.
func (n *fakeNode) hostIdentity(t *testing.T, worker int) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(n.identityDir(worker))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(n.identityDir(worker), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = data
	}
	return files
}

// checkIdentity verifies a workload's identity files: the certificate
// names actor actorUID (as fakeNode.workload names it), chains to ca.pem,
// and belongs to key.pem. It returns the certificate.
func checkIdentity(t *testing.T, files map[string][]byte, actorUID string) *x509.Certificate {
	t.Helper()
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	if want := []string{IdentityActorFile, IdentityCAFile, IdentityCertFile, IdentityKeyFile}; !slices.Equal(names, want) {
		t.Fatalf("identity files %v, want %v", names, want)
	}
	if env, want := string(files[IdentityActorFile]), "TORPOR_SPACE=s\nTORPOR_ACTOR=actor-"+actorUID+"\nTORPOR_ACTOR_UID="+actorUID+"\n"; !strings.HasPrefix(env, want) {
		t.Fatalf("actor.env %q, want it to start %q", env, want)
	}
	pair, err := tls.X509KeyPair(files[IdentityCertFile], files[IdentityKeyFile])
	if err != nil {
		t.Fatalf("cert.pem and key.pem: %v", err)
	}
	leaf := pair.Leaf
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(files[IdentityCAFile]) {
		t.Fatal("ca.pem holds no certificate")
	}
	// Verified as of its issue: whether a renewal came in time is for the
	// renewal tests to say, not for a slow machine.
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: leaf.NotBefore, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("cert.pem does not verify against ca.pem: %v", err)
	}
	if len(pair.Certificate) != 2 {
		t.Fatalf("cert.pem holds %d certificates, want the certificate and its CA", len(pair.Certificate))
	}
	w, err := identity.WorkloadFromCertificate(leaf, identity.DefaultTrustDomain)
	if err != nil {
		t.Fatal(err)
	}
	if want := (identity.Workload{Space: "s", Actor: "actor-" + actorUID, ActorUID: actorUID}); w != want {
		t.Fatalf("certificate of %+v, want %+v", w, want)
	}
	return leaf
}

func (n *fakeNode) checkpointFull(t *testing.T, actorUID, opID string, worker int) *torporv1.SnapshotSource {
	t.Helper()
	location := "s/" + actorUID + "/" + opID
	resp, err := n.client.Checkpoint(context.Background(), connect.NewRequest(&torporv1.CheckpointRequest{
		Op: op(actorUID, opID, n.worker(worker)), Scope: torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		Target: torporv1.CheckpointTarget_CHECKPOINT_TARGET_STORAGE, Location: location,
	}))
	if err != nil {
		t.Fatal(err)
	}
	return &torporv1.SnapshotSource{Location: location, ManifestDigest: resp.Msg.GetManifestDigest()}
}

func (n *fakeNode) restore(ctx context.Context, w *torporv1.Workload, opID string, worker int, scope torporv1.RestoreScope, snap, golden *torporv1.SnapshotSource) error {
	_, err := n.client.Restore(ctx, connect.NewRequest(&torporv1.RestoreRequest{
		Op: op(w.GetActorUid(), opID, n.worker(worker)), Workload: w, Scope: scope, Snapshot: snap, Golden: golden,
	}))
	return err
}

func wantNoIdentity(t *testing.T, n *fakeNode, worker int, when string) {
	t.Helper()
	if files := n.hostIdentity(t, worker); len(files) != 0 {
		t.Fatalf("%s: worker %d still has identity files %v", when, worker, files)
	}
}

// TestIdentityFollowsTheActor: the certificate is in place before the
// sandbox starts, a restore (on another worker) gets a new one rather
// than its snapshot's, and a freed worker keeps none.
func TestIdentityFollowsTheActor(t *testing.T) {
	plane := newAuthorizingPlane(t, 0)
	n, witness := newIdentityNode(t, plane)
	ctx := context.Background()

	plane.place(t, "a1", n.worker(0))
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	booted := witness.last(t, "a1")
	if booted.method != "Run" || !booted.mounted {
		t.Fatalf("first start %+v, want a Run with the identity mounted", booted)
	}
	first := checkIdentity(t, booted.files, "a1")
	if booted.keyMode != 0o600 {
		t.Fatalf("key.pem has mode %v, want 0600", booted.keyMode)
	}

	snap := n.checkpointFull(t, "a1", "op-suspend", 0)
	wantNoIdentity(t, n, 0, "after the suspend")

	plane.place(t, "a1", n.worker(1))
	if err := n.restore(ctx, n.workload("a1"), "op-resume", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, snap, nil); err != nil {
		t.Fatal(err)
	}
	resumed := witness.last(t, "a1")
	if resumed.method != "Restore" || resumed.slot != n.worker(1) {
		t.Fatalf("latest start %+v, want a Restore on worker 1", resumed)
	}
	again := checkIdentity(t, resumed.files, "a1")
	if again.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatalf("the restored actor got serial %x again", first.SerialNumber)
	}
	if bytes.Equal(resumed.files[IdentityKeyFile], booted.files[IdentityKeyFile]) {
		t.Fatal("the restored actor got the key of its first run again")
	}

	if err := n.terminate(ctx, "a1", "op-terminate", 1); err != nil {
		t.Fatal(err)
	}
	wantNoIdentity(t, n, 1, "after the terminate")
}

// TestIdentityTellsAFork: a restore of another actor's snapshot (a
// fork's first start) gets the fork's own certificate and names its
// source in actor.env; the source's own starts do not.
func TestIdentityTellsAFork(t *testing.T) {
	plane := newAuthorizingPlane(t, 0)
	n, witness := newIdentityNode(t, plane)
	ctx := context.Background()

	plane.place(t, "a1", n.worker(0))
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	if env := string(witness.last(t, "a1").files[IdentityActorFile]); strings.Contains(env, "TORPOR_FORKED_FROM") {
		t.Fatalf("a first run says it is a fork: %q", env)
	}
	snap := n.checkpointFull(t, "a1", "op-suspend", 0)

	plane.place(t, "a2", n.worker(1))
	fork := n.workload("a2")
	fork.ForkedFrom = "s/actor-a1"
	if err := n.restore(ctx, fork, "op-fork", 1, torporv1.RestoreScope_RESTORE_SCOPE_FULL, snap, nil); err != nil {
		t.Fatal(err)
	}
	started := witness.last(t, "a2")
	checkIdentity(t, started.files, "a2")
	if env := string(started.files[IdentityActorFile]); !strings.HasSuffix(env, "TORPOR_FORKED_FROM=s/actor-a1\n") {
		t.Fatalf("the fork's actor.env %q does not name its source", env)
	}

	bad := n.workload("a3")
	bad.ForkedFrom = "s/x\nTORPOR_ACTOR=a1"
	plane.place(t, "a3", n.worker(0))
	err := n.restore(ctx, bad, "op-bad", 0, torporv1.RestoreScope_RESTORE_SCOPE_FULL, snap, nil)
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "workload.forkedFrom") {
		t.Fatalf("a forkedFrom that is not SPACE/ACTOR: %v, want InvalidArgument naming workload.forkedFrom", err)
	}
}

// TestIdentityRenewed: a running workload's certificate is replaced
// before it expires (same key, so cert.pem always matches key.pem), and
// renewal stops with the workload.
func TestIdentityRenewed(t *testing.T) {
	const ttl = 2 * time.Second
	plane := newAuthorizingPlane(t, ttl)
	n, _ := newIdentityNode(t, plane)
	ctx := context.Background()
	plane.place(t, "a1", n.worker(0))
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	files := n.hostIdentity(t, 0)
	first := checkIdentity(t, files, "a1")
	var renewed *x509.Certificate
	waitFor(t, "the certificate to be renewed", func() bool {
		now := n.hostIdentity(t, 0)
		renewed = checkIdentity(t, now, "a1")
		if !bytes.Equal(now[IdentityKeyFile], files[IdentityKeyFile]) {
			t.Fatal("renewal replaced key.pem under the running workload")
		}
		return renewed.SerialNumber.Cmp(first.SerialNumber) != 0
	})
	if !renewed.NotAfter.After(first.NotAfter) {
		t.Fatalf("renewed certificate expires %v, not after the first (%v)", renewed.NotAfter, first.NotAfter)
	}

	if err := n.terminate(ctx, "a1", "op-terminate", 0); err != nil {
		t.Fatal(err)
	}
	mints := plane.mints.Load()
	// Two renewal periods: a renewal still scheduled would have run.
	time.Sleep(ttl)
	wantNoIdentity(t, n, 0, "after the terminate")
	if got := plane.mints.Load(); got != mints {
		t.Fatalf("%d mints after the workload was terminated", got-mints)
	}
	if staged, err := os.ReadDir(filepath.Join(n.cfg.StateDir, identityDir, stagingDir)); err != nil || len(staged) != 0 {
		t.Fatalf("staging directory holds %v (%v), want nothing: every staged file is moved in", staged, err)
	}
}

// TestIdentityMintRefused: a start whose mint the control plane refuses
// fails with the control plane's code, names the actor, never starts a
// sandbox and leaves the worker free.
func TestIdentityMintRefused(t *testing.T) {
	plane := newAuthorizingPlane(t, 0)
	n, witness := newIdentityNode(t, plane)
	ctx := context.Background()
	// A snapshot to restore a2 from.
	plane.place(t, "a2", n.worker(0))
	if _, err := n.run(ctx, "a2", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	snap := n.checkpointFull(t, "a2", "op-suspend", 0)

	tests := []struct {
		name   string
		actor  string
		placed string // the worker the store places the actor on
		start  func(opID string) error
	}{
		{"run, actor placed nowhere", "a1", "", func(opID string) error { _, err := n.run(ctx, "a1", opID, 0); return err }},
		{"run, actor placed on another worker", "a1", n.worker(1), func(opID string) error { _, err := n.run(ctx, "a1", opID, 0); return err }},
		{"restore, actor placed nowhere", "a2", "", func(opID string) error {
			return n.restore(ctx, n.workload("a2"), opID, 0, torporv1.RestoreScope_RESTORE_SCOPE_FULL, snap, nil)
		}},
		{"restore, actor placed on another worker", "a2", n.worker(1), func(opID string) error {
			return n.restore(ctx, n.workload("a2"), opID, 0, torporv1.RestoreScope_RESTORE_SCOPE_FULL, snap, nil)
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plane.place(t, tt.actor, tt.placed)
			starts := len(witness.Calls())
			err := tt.start(fmt.Sprintf("op-refused-%d", i))
			wantCode(t, err, connect.CodePermissionDenied)
			if !strings.Contains(err.Error(), "s/actor-"+tt.actor) {
				t.Fatalf("error %q does not name actor s/actor-%s", err, tt.actor)
			}
			for _, c := range witness.Calls()[starts:] {
				if c.Method == "Run" || c.Method == "Restore" {
					t.Fatalf("runtime %s called for a refused start", c.Method)
				}
			}
			if st := n.stats(t, 0); st.GetRunning() || st.GetActorUid() != "" {
				t.Fatalf("stats %v after a refused start, want the worker free", st)
			}
			wantNoIdentity(t, n, 0, "after a refused start")
		})
	}
}

// TestGoldenBuildMountsAnEmptyIdentity: a golden build has no actor to
// mint for, yet mounts the identity directory, so actors restore from its
// image (runsc, like the fake, requires the mounts it was taken with).
func TestGoldenBuildMountsAnEmptyIdentity(t *testing.T) {
	plane := newAuthorizingPlane(t, 0)
	n, witness := newIdentityNode(t, plane)
	ctx := context.Background()
	golden := &torporv1.Workload{Space: "s", Actor: goldenActorPrefix + "app", ActorUid: "t1", TemplateName: "app", TemplateUid: "t1", Template: n.tmpl}
	// Nothing is placed: a mint would be refused.
	if _, err := n.client.Run(ctx, connect.NewRequest(&torporv1.RunRequest{Op: op("t1", "op-golden", n.worker(0)), Workload: golden})); err != nil {
		t.Fatal(err)
	}
	if built := witness.last(t, "t1"); !built.mounted || len(built.files) != 0 {
		t.Fatalf("golden build started with identity mounted=%v, files %v; want an empty mounted directory", built.mounted, built.files)
	}
	if got := plane.mints.Load(); got != 0 {
		t.Fatalf("%d mints for a golden build", got)
	}
	image := n.checkpointFull(t, "t1", "op-golden-capture", 0)

	plane.place(t, "a1", n.worker(1))
	if err := n.restore(ctx, n.workload("a1"), "op-first-start", 1, torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN, nil, image); err != nil {
		t.Fatal(err)
	}
	checkIdentity(t, witness.last(t, "a1").files, "a1")
}

// TestIdentityRenewedAfterAgentRestart: an agent that adopts a running
// workload renews its certificate; the agent that stopped does not.
func TestIdentityRenewedAfterAgentRestart(t *testing.T) {
	plane := newAuthorizingPlane(t, 2*time.Second)
	n, _ := newIdentityNode(t, plane)
	ctx := context.Background()
	plane.place(t, "a1", n.worker(0))
	if _, err := n.run(ctx, "a1", "op-run", 0); err != nil {
		t.Fatal(err)
	}
	n.restart(t)
	// The stopped agent renews no more: what changes now is the new one's.
	files := n.hostIdentity(t, 0)
	before := checkIdentity(t, files, "a1")
	waitFor(t, "the adopted workload's certificate to be renewed", func() bool {
		return checkIdentity(t, n.hostIdentity(t, 0), "a1").SerialNumber.Cmp(before.SerialNumber) != 0
	})
	if now := n.hostIdentity(t, 0); !bytes.Equal(now[IdentityKeyFile], files[IdentityKeyFile]) {
		t.Fatal("renewal after the restart replaced key.pem under the running workload")
	}
}
