package server

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/latency"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/testkit"
	"github.com/torpor-dev/torpor/internal/validate"
)

// placement is a worker and the actor it hosts, pointing at each other.
type placement struct {
	worker *torporv1.Worker
	actor  *torporv1.Actor
}

func (p placement) claim() *torporv1.WorkloadClaim {
	return &torporv1.WorkloadClaim{
		WorkerNamespace: p.worker.GetMetadata().GetSpace(), WorkerName: p.worker.GetMetadata().GetName(),
		WorkerUid: p.worker.GetMetadata().GetUid(), ActorUid: p.actor.GetMetadata().GetUid(),
	}
}

func createWorker(tb testing.TB, st store.Store, name, node string) *torporv1.Worker {
	tb.Helper()
	w, err := st.Workers().Create(context.Background(), &torporv1.Worker{
		Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: name},
		Spec:     &torporv1.WorkerSpec{Node: node, Ip: "10.0.0.2", SandboxClass: "gvisor"},
		Status:   &torporv1.WorkerStatus{},
	})
	if err != nil {
		tb.Fatalf("create worker %s: %v", name, err)
	}
	return w
}

func createActor(tb testing.TB, st store.Store, name string) *torporv1.Actor {
	tb.Helper()
	a, err := st.Actors().Create(context.Background(), &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: store.DefaultSpace, Name: name},
		Spec:     &torporv1.ActorSpec{Template: "counter"},
		Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_SUSPENDED},
	})
	if err != nil {
		tb.Fatalf("create actor %s: %v", name, err)
	}
	return a
}

// place points worker and actor at each other in one transaction, as the
// workflow's claim does, and returns both as stored.
func place(tb testing.TB, st store.Store, w *torporv1.Worker, a *torporv1.Actor) placement {
	tb.Helper()
	ctx := context.Background()
	var p placement
	err := st.InTx(ctx, func(tx store.Tx) error {
		w, err := tx.Workers().Get(ctx, w.GetMetadata().GetSpace(), w.GetMetadata().GetName())
		if err != nil {
			return err
		}
		a, err := tx.Actors().Get(ctx, a.GetMetadata().GetSpace(), a.GetMetadata().GetName())
		if err != nil {
			return err
		}
		am, wm := a.GetMetadata(), w.GetMetadata()
		w.Status = &torporv1.WorkerStatus{Actor: &torporv1.ActorRef{Space: am.GetSpace(), Name: am.GetName(), Uid: am.GetUid()}}
		a.Status.State = torporv1.ActorState_ACTOR_STATE_RUNNING
		a.Status.Worker = &torporv1.WorkerRef{Namespace: wm.GetSpace(), Name: wm.GetName(), Uid: wm.GetUid(), Node: w.GetSpec().GetNode(), Ip: w.GetSpec().GetIp()}
		if p.worker, err = tx.Workers().Update(ctx, w); err != nil {
			return err
		}
		p.actor, err = tx.Actors().Update(ctx, a)
		return err
	})
	if err != nil {
		tb.Fatalf("place actor %s on worker %s: %v", a.GetMetadata().GetName(), w.GetMetadata().GetName(), err)
	}
	return p
}

// release frees both sides of p in one transaction.
func release(tb testing.TB, st store.Store, p placement) {
	tb.Helper()
	ctx := context.Background()
	err := st.InTx(ctx, func(tx store.Tx) error {
		w, err := tx.Workers().Get(ctx, p.worker.GetMetadata().GetSpace(), p.worker.GetMetadata().GetName())
		if err != nil {
			return err
		}
		a, err := tx.Actors().Get(ctx, p.actor.GetMetadata().GetSpace(), p.actor.GetMetadata().GetName())
		if err != nil {
			return err
		}
		w.Status = &torporv1.WorkerStatus{}
		a.Status.State = torporv1.ActorState_ACTOR_STATE_SUSPENDED
		a.Status.Worker = nil
		if _, err := tx.Workers().Update(ctx, w); err != nil {
			return err
		}
		_, err = tx.Actors().Update(ctx, a)
		return err
	})
	if err != nil {
		tb.Fatalf("release worker %s: %v", p.worker.GetMetadata().GetName(), err)
	}
}

func mustCSR(tb testing.TB) (crypto.Signer, []byte) {
	tb.Helper()
	key, csr, err := identity.NewCSR()
	if err != nil {
		tb.Fatal(err)
	}
	return key, csr
}

// checkWorkloadCertificate verifies a MintCert answer for p's actor.
func checkWorkloadCertificate(t *testing.T, resp *torporv1.IssuedCertificate, key crypto.Signer, p placement) {
	t.Helper()
	roots, err := identity.CertPool(resp.GetTrustBundle())
	if err != nil {
		t.Fatal(err)
	}
	chain := resp.GetCertificateChain()
	cert, err := identity.TLSCertificate(key, chain)
	if err != nil {
		t.Fatal(err)
	}
	leaf := cert.Leaf
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("workload certificate does not verify with the trust bundle: %v", err)
	}
	if len(chain) != 2 || !bytes.Equal(chain[1], resp.GetTrustBundle()[0]) {
		t.Errorf("chain has %d certificates; want the certificate, then the CA", len(chain))
	}
	am := p.actor.GetMetadata()
	got, err := identity.WorkloadFromCertificate(leaf, identity.DefaultTrustDomain)
	if want := (identity.Workload{Space: am.GetSpace(), Actor: am.GetName(), ActorUID: am.GetUid()}); err != nil || got != want {
		t.Errorf("certificate names %+v (%v), want %+v", got, err, want)
	}
	wantID := identity.ActorID(identity.DefaultTrustDomain, am.GetSpace(), am.GetName())
	if resp.GetSpiffeId() != wantID || leaf.URIs[0].String() != wantID {
		t.Errorf("SPIFFE ID %q (certificate %v), want %s", resp.GetSpiffeId(), leaf.URIs, wantID)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life < identity.DefaultWorkloadCertTTL || life > identity.DefaultWorkloadCertTTL+2*time.Minute {
		t.Errorf("lifetime %s, want about %s", life, identity.DefaultWorkloadCertTTL)
	}
	if !resp.GetExpireTime().AsTime().Equal(leaf.NotAfter) {
		t.Errorf("expire_time %s, certificate says %s", resp.GetExpireTime().AsTime(), leaf.NotAfter)
	}
}

// mintingAgent is a node agent whose workloads, like real ones, get their
// certificate before they start: it mints through its own replica, which
// need not be the one that placed the actor.
type mintingAgent struct {
	torporv1connect.UnimplementedNodeAgentServiceHandler
	identity torporv1connect.IdentityServiceClient
	workers  map[string]*torporv1.Worker // by name, as registered
	minted   atomic.Int64
}

func (m *mintingAgent) Run(ctx context.Context, req *connect.Request[torporv1.RunRequest]) (*connect.Response[torporv1.RunResponse], error) {
	ip, err := m.start(ctx, req.Msg.GetOp(), req.Msg.GetWorkload())
	return connect.NewResponse(&torporv1.RunResponse{WorkerIp: ip}), err
}

func (m *mintingAgent) Restore(ctx context.Context, req *connect.Request[torporv1.RestoreRequest]) (*connect.Response[torporv1.RestoreResponse], error) {
	ip, err := m.start(ctx, req.Msg.GetOp(), req.Msg.GetWorkload())
	return connect.NewResponse(&torporv1.RestoreResponse{WorkerIp: ip}), err
}

func (m *mintingAgent) start(ctx context.Context, op *torporv1.Operation, wl *torporv1.Workload) (string, error) {
	w, ok := m.workers[op.GetWorker()]
	if !ok {
		return "", connect.NewError(connect.CodeNotFound, fmt.Errorf("no worker %s on this node", op.GetWorker()))
	}
	key, csr, err := identity.NewCSR()
	if err != nil {
		return "", err
	}
	resp, err := m.identity.MintCert(ctx, connect.NewRequest(&torporv1.MintCertRequest{
		Workload: &torporv1.WorkloadClaim{
			WorkerNamespace: w.GetMetadata().GetSpace(), WorkerName: w.GetMetadata().GetName(),
			WorkerUid: w.GetMetadata().GetUid(), ActorUid: wl.GetActorUid(),
		},
		Csr: csr,
	}))
	if err != nil {
		return "", fmt.Errorf("mint actor certificate: %w", err)
	}
	if _, err := identity.TLSCertificate(key, resp.Msg.GetCertificateChain()); err != nil {
		return "", err
	}
	if want := identity.ActorID(identity.DefaultTrustDomain, wl.GetSpace(), wl.GetActor()); resp.Msg.GetSpiffeId() != want {
		return "", fmt.Errorf("minted %s, want %s", resp.Msg.GetSpiffeId(), want)
	}
	m.minted.Add(1)
	return w.GetSpec().GetIp(), nil
}

// TestResumeMintsOnAnotherReplica is the reported failure, reproduced:
// replica A commits the worker assignment and calls the node, whose
// workload at once asks replica B for its certificate. B must grant it from
// the store, every time, on both backends.
func TestResumeMintsOnAnotherReplica(t *testing.T) {
	for _, backend := range storetest.Backends {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			url := storetest.URL(t, backend)
			logs := &testkit.SyncBuffer{}
			a, b := startReplica(t, url, logs), startReplica(t, url, logs)
			nodeCert := joinNode(t, a, b, "node-1")

			agent := &mintingAgent{identity: b.identity(t, nodeCert), workers: map[string]*torporv1.Worker{}}
			agentMux := http.NewServeMux()
			agentMux.Handle(torporv1connect.NewNodeAgentServiceHandler(agent))
			agentURL := serveTLS(t, agentMux, identity.ServerTLSConfig(nodeCert, a.roots))

			const actors = 3
			reg := &torporv1.RegisterNodeRequest{Node: &torporv1.Node{
				Metadata: &torporv1.ObjectMeta{Name: "node-1"}, Address: agentURL, SandboxClasses: []string{"gvisor"},
			}}
			for i := range actors {
				reg.Workers = append(reg.Workers, &torporv1.Worker{
					Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: fmt.Sprintf("w%d", i)},
					Spec:     &torporv1.WorkerSpec{Node: "node-1", Ip: fmt.Sprintf("10.0.0.%d", 2+i), SandboxClass: "gvisor"},
				})
			}
			registered, err := torporv1connect.NewNodeServiceClient(a.httpClient(t, nodeCert), a.url).RegisterNode(ctx, connect.NewRequest(reg))
			if err != nil {
				t.Fatalf("register node: %v", err)
			}
			for _, w := range registered.Msg.GetWorkers() {
				agent.workers[w.GetMetadata().GetName()] = w
			}
			hc := a.admin(t)
			if _, err := torporv1connect.NewTemplateServiceClient(hc, a.url).CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: counterTemplate("counter")})); err != nil {
				t.Fatal(err)
			}
			actorsA := torporv1connect.NewActorServiceClient(hc, a.url)
			for i := range actors {
				name := fmt.Sprintf("a%d", i)
				if _, err := actorsA.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
					Metadata: &torporv1.ObjectMeta{Space: "default", Name: name}, Spec: &torporv1.ActorSpec{Template: "counter"},
				}})); err != nil {
					t.Fatal(err)
				}
				resumed, err := actorsA.ResumeActor(ctx, connect.NewRequest(&torporv1.ResumeActorRequest{Space: "default", Name: name}))
				if err != nil {
					t.Fatalf("resume %s through replica A (minting through B): %v\nlogs:\n%s", name, err, logs)
				}
				if got := resumed.Msg.GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
					t.Errorf("actor %s is %s after resume, want RUNNING", name, got)
				}
			}
			if got := agent.minted.Load(); got != actors {
				t.Errorf("%d certificates minted, want %d", got, actors)
			}
		})
	}
}

// TestMintRightAfterAssignment alternates the replica that writes the
// assignment and the one that mints, 500 times, switching the worker
// between two actors: no mint may ever be denied.
func TestMintRightAfterAssignment(t *testing.T) {
	const cycles = 500
	for _, backend := range storetest.Backends {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			url := storetest.URL(t, backend)
			logs := &testkit.SyncBuffer{}
			replicas := []*replica{startReplica(t, url, logs), startReplica(t, url, logs)}
			nodeCert := joinNode(t, replicas[0], replicas[1], "node-1")
			clients := []torporv1connect.IdentityServiceClient{replicas[0].identity(t, nodeCert), replicas[1].identity(t, nodeCert)}
			st := replicas[0].store
			w := createWorker(t, st, "w0", "node-1")
			actors := []*torporv1.Actor{createActor(t, st, "x0"), createActor(t, st, "x1")}
			_, csr := mustCSR(t)
			denied := 0
			for i := range cycles {
				writer, minter := i%2, (i+1)%2
				p := place(t, replicas[writer].store, w, actors[(i/2)%2])
				resp, err := clients[minter].MintCert(ctx, connect.NewRequest(&torporv1.MintCertRequest{Workload: p.claim(), Csr: csr}))
				switch {
				case connect.CodeOf(err) == connect.CodePermissionDenied:
					denied++
				case err != nil:
					t.Fatalf("cycle %d: %v", i, err)
				case !strings.HasSuffix(resp.Msg.GetSpiffeId(), "/actor/"+p.actor.GetMetadata().GetName()):
					t.Fatalf("cycle %d: minted %s for actor %s", i, resp.Msg.GetSpiffeId(), p.actor.GetMetadata().GetName())
				}
				release(t, replicas[writer].store, p)
			}
			if denied > 0 {
				t.Fatalf("%d of %d mints right after a committed assignment were denied\nlogs:\n%s", denied, cycles, logs)
			}
		})
	}
}

// jwksKey fetches the replica's published key set and returns the key a
// token names, as a relying party would.
func jwksKey(t *testing.T, r *replica, hc *http.Client) jwt.Keyfunc {
	t.Helper()
	resp, err := hc.Get(r.url + identity.JWKSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var set struct{ Keys []struct{ Kid, X, Y string } }
	if err := json.NewDecoder(resp.Body).Decode(&set); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", identity.JWKSPath, resp.Status, err)
	}
	keys := map[string]*ecdsa.PublicKey{}
	for _, k := range set.Keys {
		x, _ := base64.RawURLEncoding.DecodeString(k.X)
		y, _ := base64.RawURLEncoding.DecodeString(k.Y)
		pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), slices.Concat([]byte{4}, x, y))
		if err != nil {
			t.Fatalf("JWKS key %s: %v", k.Kid, err)
		}
		keys[k.Kid] = pub
	}
	return func(tok *jwt.Token) (any, error) {
		kid, _ := tok.Header["kid"].(string)
		if k, ok := keys[kid]; ok {
			return k, nil
		}
		return nil, fmt.Errorf("kid %v is not published", tok.Header["kid"])
	}
}

// TestMintAuthorization: one grant, then each reason to refuse on its own.
// Every refusal answers the same message; the reason goes to the log.
func TestMintAuthorization(t *testing.T) {
	for _, backend := range storetest.Backends {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			logs := &testkit.SyncBuffer{}
			r := startReplica(t, storetest.URL(t, backend), logs)
			st := r.store
			nodeA, nodeB := joinNode(t, r, r, "node-a"), joinNode(t, r, r, "node-b")
			bystander := createActor(t, st, "bystander")
			workloadCert := func() *identity.Keypair {
				w, a := createWorker(t, st, "w-wl", "node-a"), createActor(t, st, "wl")
				key, csr := mustCSR(t)
				resp, err := r.identity(t, nodeA).MintCert(ctx, connect.NewRequest(&torporv1.MintCertRequest{Workload: place(t, st, w, a).claim(), Csr: csr}))
				if err != nil {
					t.Fatal(err)
				}
				cert, err := identity.TLSCertificate(key, resp.Msg.GetCertificateChain())
				if err != nil {
					t.Fatal(err)
				}
				return identity.NewKeypair(cert)
			}()

			cases := []struct {
				name   string
				caller *identity.Keypair
				// arrange changes the placed pair or the claim before the mint.
				arrange func(t *testing.T, p placement, claim *torporv1.WorkloadClaim)
				code    connect.Code // 0: granted
				reason  string       // logged for a refusal
			}{
				{name: "granted", caller: nodeA},
				{name: "node X mints for a worker on node Y", caller: nodeB,
					code: connect.CodePermissionDenied, reason: `worker is on node \"node-a\"`},
				{name: "wrong worker uid", caller: nodeA, code: connect.CodePermissionDenied, reason: "worker uid is",
					arrange: func(_ *testing.T, _ placement, c *torporv1.WorkloadClaim) { c.WorkerUid = uuid.NewString() }},
				{name: "unknown worker", caller: nodeA, code: connect.CodePermissionDenied, reason: "worker does not exist",
					arrange: func(_ *testing.T, _ placement, c *torporv1.WorkloadClaim) { c.WorkerName = "nowhere" }},
				{name: "worker hosts no actor", caller: nodeA, code: connect.CodePermissionDenied, reason: "worker hosts no actor",
					arrange: func(t *testing.T, p placement, _ *torporv1.WorkloadClaim) { release(t, st, p) }},
				{name: "worker names another actor", caller: nodeA, code: connect.CodePermissionDenied, reason: "worker hosts actor default/bystander",
					arrange: func(t *testing.T, p placement, _ *torporv1.WorkloadClaim) {
						w := proto.CloneOf(p.worker)
						bm := bystander.GetMetadata()
						w.Status.Actor = &torporv1.ActorRef{Space: bm.GetSpace(), Name: bm.GetName(), Uid: bm.GetUid()}
						mustUpdate(t, st.Workers(), w)
					}},
				{name: "actor names another worker", caller: nodeA, code: connect.CodePermissionDenied, reason: "is placed on worker torpor-system/elsewhere",
					arrange: func(t *testing.T, p placement, _ *torporv1.WorkloadClaim) {
						a := proto.CloneOf(p.actor)
						a.Status.Worker = &torporv1.WorkerRef{Namespace: validate.WorkerNamespace, Name: "elsewhere", Uid: uuid.NewString(), Node: "node-a"}
						mustUpdate(t, st.Actors(), a)
					}},
				{name: "actor re-created under its name", caller: nodeA, code: connect.CodePermissionDenied, reason: "now has uid",
					arrange: func(t *testing.T, p placement, _ *torporv1.WorkloadClaim) {
						am := p.actor.GetMetadata()
						if err := st.Actors().Delete(ctx, am.GetSpace(), am.GetName(), "", 0); err != nil {
							t.Fatal(err)
						}
						again := proto.CloneOf(p.actor)
						again.Metadata = &torporv1.ObjectMeta{Space: am.GetSpace(), Name: am.GetName()}
						if _, err := st.Actors().Create(ctx, again); err != nil {
							t.Fatal(err)
						}
					}},
				{name: "actor DELETING", caller: nodeA, code: connect.CodePermissionDenied, reason: "is being deleted",
					arrange: func(t *testing.T, p placement, _ *torporv1.WorkloadClaim) {
						a := proto.CloneOf(p.actor)
						a.Status.State = torporv1.ActorState_ACTOR_STATE_DELETING
						mustUpdate(t, st.Actors(), a)
					}},
				{name: "no node certificate", caller: nil, code: connect.CodeUnauthenticated},
				{name: "workload certificate instead of a node's", caller: workloadCert, code: connect.CodeUnauthenticated},
			}
			var deniedMessages []string
			for i, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					p := place(t, st, createWorker(t, st, fmt.Sprintf("w%d", i), "node-a"), createActor(t, st, fmt.Sprintf("a%d", i)))
					claim := p.claim()
					if tc.arrange != nil {
						tc.arrange(t, p, claim)
					}
					hc := r.httpClient(t, tc.caller)
					client := torporv1connect.NewIdentityServiceClient(hc, r.url)
					key, csr := mustCSR(t)
					cert, certErr := client.MintCert(ctx, connect.NewRequest(&torporv1.MintCertRequest{Workload: claim, Csr: csr}))
					tok, jwtErr := client.MintJWT(ctx, connect.NewRequest(&torporv1.MintJWTRequest{Workload: claim, Audience: []string{"vault"}}))
					if tc.code == 0 {
						if certErr != nil || jwtErr != nil {
							t.Fatalf("MintCert: %v; MintJWT: %v", certErr, jwtErr)
						}
						checkWorkloadCertificate(t, cert.Msg, key, p)
						claims := &identity.WorkloadClaims{}
						if _, err := jwt.ParseWithClaims(tok.Msg.GetToken(), claims, jwksKey(t, r, hc), jwt.WithValidMethods([]string{"ES256"}),
							jwt.WithIssuer("https://localhost"), jwt.WithAudience("vault"), jwt.WithExpirationRequired()); err != nil {
							t.Fatalf("JWT does not verify with the published keys: %v", err)
						}
						if claims.Subject != tok.Msg.GetSpiffeId() || claims.ActorUID != p.actor.GetMetadata().GetUid() {
							t.Errorf("JWT claims %+v; want sub %s and the actor's uid", claims, tok.Msg.GetSpiffeId())
						}
						return
					}
					for what, err := range map[string]error{"MintCert": certErr, "MintJWT": jwtErr} {
						if connect.CodeOf(err) != tc.code {
							t.Fatalf("%s: %v, want %v", what, err, tc.code)
						}
						if tc.code == connect.CodePermissionDenied {
							deniedMessages = append(deniedMessages, err.Error())
						}
					}
					worker := "worker=" + validate.WorkerNamespace + "/" + claim.GetWorkerName() + " "
					logged := slices.ContainsFunc(strings.Split(logs.String(), "\n"), func(line string) bool {
						return strings.Contains(line, "mint denied") && strings.Contains(line, worker) && strings.Contains(line, tc.reason)
					})
					if tc.reason != "" && !logged {
						t.Errorf("no log line gives the reason %q for %s:\n%s", tc.reason, worker, logs)
					}
				})
			}
			if answers := slices.Compact(slices.Sorted(slices.Values(deniedMessages))); len(answers) != 1 {
				t.Errorf("refusals answered differently: %q", answers)
			}
		})
	}
}

func mustUpdate[T store.Object](t *testing.T, c store.Collection[T], obj T) {
	t.Helper()
	if _, err := c.Update(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}

func TestMintRequestChecked(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, storetest.URL(t, "sqlite"), io.Discard)
	client := r.identity(t, joinNode(t, r, r, "node-a"))
	p := place(t, r.store, createWorker(t, r.store, "w0", "node-a"), createActor(t, r.store, "a0"))
	_, csr := mustCSR(t)
	cases := []struct {
		name  string
		req   *torporv1.MintCertRequest
		field string
	}{
		{"no workload", &torporv1.MintCertRequest{Csr: csr}, "workload.workerNamespace"},
		{"no actor uid", &torporv1.MintCertRequest{Workload: &torporv1.WorkloadClaim{WorkerNamespace: "n", WorkerName: "w", WorkerUid: "u"}, Csr: csr}, "workload.actorUid"},
		{"bad csr", &torporv1.MintCertRequest{Workload: p.claim(), Csr: []byte("junk")}, "csr"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.MintCert(ctx, connect.NewRequest(tc.req))
			wantCode(t, err, connect.CodeInvalidArgument, tc.field)
		})
	}
	_, err := client.MintJWT(ctx, connect.NewRequest(&torporv1.MintJWTRequest{Workload: p.claim()}))
	wantCode(t, err, connect.CodeInvalidArgument, "audience")
}

// TestNodeJoinAndRenew: a token made through one replica joins through
// another; the CA is the same on every replica and after a restart.
func TestNodeJoinAndRenew(t *testing.T) {
	for _, backend := range storetest.Backends {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			url := storetest.URL(t, backend)
			a, b := startReplica(t, url, io.Discard), startReplica(t, url, io.Discard)
			anon := a.identity(t, nil)
			admin := torporv1connect.NewIdentityServiceClient(a.admin(t), a.url)
			tok, err := admin.CreateToken(ctx, connect.NewRequest(&torporv1.CreateTokenRequest{
				Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_NODE_JOIN, Name: "node-1",
			}))
			if err != nil {
				t.Fatal(err)
			}
			join := func(token, node string) (crypto.Signer, *torporv1.IssuedCertificate, error) {
				key, csr := mustCSR(t)
				resp, err := b.identity(t, nil).Join(ctx, connect.NewRequest(&torporv1.JoinRequest{Token: token, Name: node, Csr: csr}))
				if err != nil {
					return nil, nil, err
				}
				return key, resp.Msg, nil
			}
			key, joined, err := join(tok.Msg.GetToken(), "node-1")
			if err != nil {
				t.Fatal(err)
			}
			if joined.GetSpiffeId() != identity.NodeID(identity.DefaultTrustDomain, "node-1") {
				t.Errorf("joined as %s", joined.GetSpiffeId())
			}
			// The fingerprint A gave with the token pins B's CA, and a
			// replica started later (a restart) has it too.
			restarted := startReplica(t, url, io.Discard)
			for name, r := range map[string]*replica{"B": b, "restarted": restarted} {
				if got := identity.Fingerprint(joined.GetTrustBundle()[0]); got != tok.Msg.GetCaFingerprint() {
					t.Errorf("replica %s: CA %s, token pinned %s", name, got, tok.Msg.GetCaFingerprint())
				}
				if !r.roots.Equal(a.roots) {
					t.Errorf("replica %s has another CA than A", name)
				}
			}
			for _, tc := range []struct{ name, token, node string }{
				{"reused token", tok.Msg.GetToken(), "node-1"},
				{"unknown token", "torpor-forged", "node-1"},
			} {
				_, _, err := join(tc.token, tc.node)
				wantCode(t, err, connect.CodeUnauthenticated, "invalid, expired or already used")
			}

			first, err := identity.TLSCertificate(key, joined.GetCertificateChain())
			if err != nil {
				t.Fatal(err)
			}
			nodeClient := restarted.identity(t, identity.NewKeypair(first))
			_, csr := mustCSR(t)
			renewed, err := nodeClient.RenewCertificate(ctx, connect.NewRequest(&torporv1.RenewCertificateRequest{Csr: csr}))
			if err != nil {
				t.Fatalf("renew: %v", err)
			}
			if renewed.Msg.GetSpiffeId() != joined.GetSpiffeId() {
				t.Errorf("renewed as %s, joined as %s", renewed.Msg.GetSpiffeId(), joined.GetSpiffeId())
			}
			_, err = anon.RenewCertificate(ctx, connect.NewRequest(&torporv1.RenewCertificateRequest{Csr: csr}))
			wantCode(t, err, connect.CodeUnauthenticated, "node or client certificate")
			_, err = nodeClient.CreateToken(ctx, connect.NewRequest(&torporv1.CreateTokenRequest{Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_NODE_JOIN}))
			wantCode(t, err, connect.CodePermissionDenied, "only an admin")
			_, err = anon.CreateToken(ctx, connect.NewRequest(&torporv1.CreateTokenRequest{Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_NODE_JOIN}))
			wantCode(t, err, connect.CodeUnauthenticated, "needs a credential")
			_, err = admin.CreateToken(ctx, connect.NewRequest(&torporv1.CreateTokenRequest{}))
			wantCode(t, err, connect.CodeInvalidArgument, "purpose")
		})
	}
}

// BenchmarkMintCert measures MintCert as a node sees it: mTLS over a kept
// connection, authorization read from the store, signing.
func BenchmarkMintCert(b *testing.B) {
	for _, backend := range storetest.Backends {
		b.Run(backend, func(b *testing.B) {
			ctx := context.Background()
			r := startReplica(b, storetest.URL(b, backend), io.Discard)
			client := r.identity(b, joinNode(b, r, r, "node-1"))
			p := place(b, r.store, createWorker(b, r.store, "w0", "node-1"), createActor(b, r.store, "a0"))
			_, csr := mustCSR(b)
			req := connect.NewRequest(&torporv1.MintCertRequest{Workload: p.claim(), Csr: csr})
			if _, err := client.MintCert(ctx, req); err != nil { // warm the connection and the keys
				b.Fatal(err)
			}
			var mints latency.Samples
			for b.Loop() {
				start := time.Now()
				if _, err := client.MintCert(ctx, req); err != nil {
					b.Fatal(err)
				}
				mints.Add(time.Since(start))
			}
			mints.Report(b, "mint", 0.50, 0.99)
		})
	}
}

func TestIdentityIssuerFromListenAddress(t *testing.T) {
	cases := []struct{ listen, option, issuer string }{
		{"", "", "https://localhost"},
		{"127.0.0.1:7070", "", "https://127.0.0.1:7070"},
		{":7070", "", "https://localhost:7070"},
		{"0.0.0.0:7070", "", "https://localhost:7070"},
		{"[::]:7070", "", "https://localhost:7070"},
		{"torpor.example:443", "", "https://torpor.example:443"},
		{"0.0.0.0:7070", "https://torpor.example", "https://torpor.example"},
	}
	for _, tc := range cases {
		s := &Server{opts: Options{Listen: tc.listen, Issuer: tc.option}}
		if got := s.identityConfig().Issuer; got != tc.issuer {
			t.Errorf("listen %q: issuer %q, want %q", tc.listen, got, tc.issuer)
		}
	}
}
