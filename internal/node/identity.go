package node

// Workload identity. Before a workload starts or restores, the agent mints
// its actor's X.509 certificate (IdentityService.MintCert, as this node)
// and writes it into a per-worker host directory that every sandbox of
// that worker mounts read-only at IdentityMountPath:
//
//	cert.pem  the certificate, then its chain (PEM)
//	key.pem   its private key (PKCS#8 PEM, mode 0600)
//	ca.pem    the CA certificates to verify peers with (PEM)
//	actor.env who the workload is, KEY=VALUE lines: TORPOR_SPACE,
//	          TORPOR_ACTOR (also the sandbox's hostname), TORPOR_ACTOR_UID,
//	          and TORPOR_FORKED_FROM ("SPACE/ACTOR") when this start
//	          restores another actor's snapshot: a fork's first start
//
// A restored guest runs on with the memory of the actor it was captured
// from; a fork's memory still holds its source's name and uid. Files
// are the guest's way to learn who it is now: a guest that keeps
// something that must be unique per actor rereads actor.env (cheaply, on
// each request, or when cert.pem changes: every start replaces it) and
// resets it when TORPOR_ACTOR_UID is not the one it knew.
//
// The files are on the host, not in the sandbox, so a restored actor never
// sees the certificate frozen in its snapshot: the directory is refilled
// with a freshly minted one before the restore. Each file is replaced by a
// rename from a staging directory outside the mount, so a guest reads a
// whole old file or a whole new one, never a half-written one or a
// temporary name.
//
// While the workload runs, its certificate is renewed at about half its
// lifetime. A renewal certifies the key the workload already has (a new
// request, same key), so key.pem never changes under a running workload
// and any cert.pem it reads matches the key.pem it read: a guest that
// loads the two separately cannot pair a new certificate with an old key.
// Every start makes a new key.
//
// Golden builds (workloads named goldenActorPrefix+template) run before
// any actor exists, so there is no one to mint for: their directory is
// mounted empty. It is mounted all the same because runsc restores an
// image only into a sandbox with the mount set it was checkpointed with,
// and actors are restored from golden images.

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/identity"
)

// IdentityMountPath is where a workload finds its identity files.
const IdentityMountPath = "/run/torpor/identity"

// The identity files a workload finds at IdentityMountPath.
const (
	IdentityCertFile  = "cert.pem"
	IdentityKeyFile   = "key.pem"
	IdentityCAFile    = "ca.pem"
	IdentityActorFile = "actor.env"
)

// goldenActorPrefix names the workload of a golden build (the control
// plane's workflow sets it): a template booted to be checkpointed, with no
// actor to mint an identity for.
const goldenActorPrefix = "golden:"

const (
	identityDir = "identity"
	// stagingDir, inside identityDir, holds files being written: on the
	// same filesystem as the mounted directories (so a rename moves them
	// in atomically) but in none of them.
	stagingDir = ".staging"
	// Renewal retries back off from the first to the second delay.
	renewRetryMin = time.Second
	renewRetryMax = 30 * time.Second
)

// certMinter mints workload certificates: the control plane's
// IdentityService, called as this node.
type certMinter interface {
	MintCert(ctx context.Context, req *connect.Request[torporv1.MintCertRequest]) (*connect.Response[torporv1.IssuedCertificate], error)
}

// workloadIdentity mints and renews the certificates of the actors that
// run on this node's workers and keeps their files.
type workloadIdentity struct {
	// root holds a directory per worker and the staging directory.
	root    string
	log     *slog.Logger
	workers workerRecords
	// minter is the control plane's IdentityService, called as this node.
	// Set before the agent serves its API; nothing mints before the node
	// registered (workerRecords waits for it).
	minter   certMinter
	renewals renewals
}

// renewals are the certificate renewals of the workloads running on a
// node, by worker name. The zero value is ready to use.
type renewals struct {
	mu       sync.Mutex
	byWorker map[string]*renewal
}

type renewal struct {
	cancel context.CancelFunc
	loop   sync.WaitGroup
}

func (r *renewal) stop() {
	r.cancel()
	r.loop.Wait()
}

// start runs loop for worker until stop; a loop already running for it is
// stopped first.
func (rs *renewals) start(worker string, loop func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &renewal{cancel: cancel}
	rs.mu.Lock()
	old := rs.byWorker[worker]
	if rs.byWorker == nil {
		rs.byWorker = map[string]*renewal{}
	}
	rs.byWorker[worker] = r
	rs.mu.Unlock()
	if old != nil {
		old.stop()
	}
	r.loop.Go(func() { loop(ctx) })
}

// stop ends worker's renewal, waiting for a renewal in progress, so
// nothing writes the worker's identity after it returns.
func (rs *renewals) stop(worker string) {
	rs.mu.Lock()
	r := rs.byWorker[worker]
	delete(rs.byWorker, worker)
	rs.mu.Unlock()
	if r != nil {
		r.stop()
	}
}

// stopAll ends every renewal (the agent stops; the workloads run on and
// the next agent renews them).
func (rs *renewals) stopAll() {
	rs.mu.Lock()
	all := rs.byWorker
	rs.byWorker = nil
	rs.mu.Unlock()
	for _, r := range all {
		r.stop()
	}
}

// dir is the host directory s's sandboxes mount at
// IdentityMountPath.
func (id *workloadIdentity) dir(s *slot) string { return filepath.Join(id.root, s.name()) }

func isGolden(w *torporv1.Workload) bool { return strings.HasPrefix(w.GetActor(), goldenActorPrefix) }

// prepare gives s's next sandbox, about to start w, its identity:
// the directory is emptied and, unless w is a golden build, filled with a
// certificate minted now for a new key. It returns the sandbox's extra
// mounts. A refused mint fails with the control plane's code.
func (id *workloadIdentity) prepare(ctx context.Context, s *slot, w *torporv1.Workload) (map[string]string, error) {
	dir := id.dir(s)
	if err := emptyDir(dir); err != nil {
		return nil, fmt.Errorf("worker %s: identity directory: %w", s.name(), err)
	}
	mounts := map[string]string{IdentityMountPath: dir}
	if isGolden(w) {
		return mounts, nil
	}
	if err := id.write(s, []identityFile{{IdentityActorFile, actorEnv(w), 0o644}}); err != nil {
		return nil, fmt.Errorf("worker %s: identity: %w", s.name(), err)
	}
	key, csr, err := identity.NewCSR()
	if err != nil {
		return nil, fmt.Errorf("actor %s/%s: identity key: %w", w.GetSpace(), w.GetActor(), err)
	}
	if _, err := id.mint(ctx, s, w, key, csr); err != nil {
		return nil, err
	}
	return mounts, nil
}

// mint has the control plane certify key (csr is its request) for
// w's actor on s, and writes the files. It returns when the certificate
// expires.
func (id *workloadIdentity) mint(ctx context.Context, s *slot, w *torporv1.Workload, key crypto.Signer, csr []byte) (time.Time, error) {
	fail := func(err error) (time.Time, error) {
		return time.Time{}, fmt.Errorf("actor %s/%s on worker %s: mint its certificate: %w", w.GetSpace(), w.GetActor(), s.name(), err)
	}
	worker, err := id.workers.registeredWorker(ctx, s.name())
	if err != nil {
		return fail(errdefs.Errorf(errdefs.ErrUnavailable, "%w", err))
	}
	resp, err := id.minter.MintCert(ctx, connect.NewRequest(&torporv1.MintCertRequest{
		Workload: &torporv1.WorkloadClaim{
			WorkerNamespace: worker.GetMetadata().GetSpace(), WorkerName: s.name(),
			WorkerUid: worker.GetMetadata().GetUid(), ActorUid: w.GetActorUid(),
		},
		Csr: csr,
	}))
	if err != nil {
		// Its code, and the words of the status error, which the edge
		// would otherwise answer without this context.
		return fail(errdefs.FromCode(connect.CodeOf(err), err.Error()))
	}
	chain, bundle := resp.Msg.GetCertificateChain(), resp.Msg.GetTrustBundle()
	// A certificate for another key would leave the workload with a pair
	// that cannot do TLS.
	tlsCert, err := identity.TLSCertificate(key, chain)
	if err != nil {
		return fail(err)
	}
	if len(bundle) == 0 {
		return fail(errors.New("the answer has no trust bundle"))
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fail(err)
	}
	files := []identityFile{
		// The certificate goes last: a workload that finds it finds the
		// rest.
		{IdentityCAFile, pemBlocks("CERTIFICATE", bundle), 0o644},
		{IdentityKeyFile, pemBlocks("PRIVATE KEY", [][]byte{keyDER}), 0o600},
		{IdentityCertFile, pemBlocks("CERTIFICATE", chain), 0o644},
	}
	if err := id.write(s, files); err != nil {
		return fail(err)
	}
	id.log.Debug("minted workload certificate", "worker", s.name(), "actor_uid", w.GetActorUid(),
		"spiffe_id", resp.Msg.GetSpiffeId(), "serial", tlsCert.Leaf.SerialNumber.Text(16), "expires", tlsCert.Leaf.NotAfter)
	return tlsCert.Leaf.NotAfter, nil
}

// actorEnv is the content of IdentityActorFile for w. Names are DNS
// labels and uids hex and dashes: no quoting is needed.
func actorEnv(w *torporv1.Workload) []byte {
	env := fmt.Sprintf("TORPOR_SPACE=%s\nTORPOR_ACTOR=%s\nTORPOR_ACTOR_UID=%s\n", w.GetSpace(), w.GetActor(), w.GetActorUid())
	if w.GetForkedFrom() != "" {
		env += "TORPOR_FORKED_FROM=" + w.GetForkedFrom() + "\n"
	}
	return []byte(env)
}

type identityFile struct {
	name string
	data []byte
	mode os.FileMode
}

func pemBlocks(typ string, ders [][]byte) []byte {
	var out []byte
	for _, der := range ders {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})...)
	}
	return out
}

// write replaces files in s's identity directory one by one, each
// atomically.
func (id *workloadIdentity) write(s *slot, files []identityFile) error {
	staging := filepath.Join(id.root, stagingDir)
	if err := os.MkdirAll(staging, 0o700); err != nil {
		return err
	}
	dir := id.dir(s)
	for _, f := range files {
		// One staging name per worker and file (so one mode per name): the
		// slot's operations and its renewal never write at once, and a
		// crash leaves nothing to collect. Nothing is fsynced: the files
		// matter only to sandboxes, which do not outlive the host, and
		// the next start mints anew.
		tmp := filepath.Join(staging, s.name()+"."+f.name)
		if err := os.WriteFile(tmp, f.data, f.mode); err != nil {
			return fmt.Errorf("write %s: %w", f.name, err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			return fmt.Errorf("install %s: %w", f.name, err)
		}
	}
	return nil
}

// emptyDir makes dir an empty directory without replacing it.
func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// keep renews the certificate of w, now running on s, until drop. It
// picks up from the certificate on disk, so it serves a workload just
// started and one a restarted agent adopted alike.
func (id *workloadIdentity) keep(s *slot, w *torporv1.Workload) {
	if isGolden(w) {
		return
	}
	id.renewals.start(s.name(), func(ctx context.Context) { id.renewLoop(ctx, s, w) })
}

// drop stops renewing s's identity and removes its files: the
// workload is gone.
func (id *workloadIdentity) drop(s *slot) error {
	id.renewals.stop(s.name())
	if err := emptyDir(id.dir(s)); err != nil {
		return fmt.Errorf("worker %s: remove identity: %w", s.name(), err)
	}
	return nil
}

// pause stops renewing worker's identity and keeps its files, as an agent
// killed during a checkpoint leaves them: the workload's capture is kept
// for the checkpoint's repeat, which removes them.
func (id *workloadIdentity) pause(worker string) { id.renewals.stop(worker) }

// stopAll stops every renewal (the agent stops; the workloads run on and
// the next agent renews them).
func (id *workloadIdentity) stopAll() { id.renewals.stopAll() }

func (id *workloadIdentity) renewLoop(ctx context.Context, s *slot, w *torporv1.Workload) {
	log := id.log.With("worker", s.name(), "actor_uid", w.GetActorUid())
	next := time.Now() // no certificate on disk: renew at once
	if leaf, err := id.leaf(s); err == nil {
		next = halfway(time.Now(), leaf.NotAfter)
	} else {
		log.Warn("workload certificate unreadable; renewing it now", "err", err)
	}
	retry := renewRetryMin
	for {
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		expires, err := id.renew(ctx, s, w)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			log.Warn("workload certificate not renewed; retrying", "err", err, "retry_in", retry)
			next, retry = time.Now().Add(retry), min(2*retry, renewRetryMax)
			continue
		}
		next, retry = halfway(time.Now(), expires), renewRetryMin
	}
}

// halfway is the middle of what is left of a certificate's lifetime.
func halfway(now, expires time.Time) time.Time { return now.Add(expires.Sub(now) / 2) }

// renew certifies the workload's key again. A workload that is
// being checkpointed or stopped is left alone: it either goes (and its
// renewal with it) or runs on, and is renewed on the next try.
func (id *workloadIdentity) renew(ctx context.Context, s *slot, w *torporv1.Workload) (time.Time, error) {
	if cur := s.current(); cur.ActorUID != w.GetActorUid() || cur.Phase != phaseRunning {
		return time.Time{}, fmt.Errorf("worker %s: actor %s is %q, not running", s.name(), w.GetActorUid(), cur.Phase)
	}
	key, err := id.key(s)
	if err != nil {
		return time.Time{}, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return time.Time{}, fmt.Errorf("worker %s: certificate request: %w", s.name(), err)
	}
	ctx, cancel := context.WithTimeout(ctx, controlPlaneTimeout)
	defer cancel()
	return id.mint(ctx, s, w, key, csr)
}

// leaf reads the certificate in s's identity directory.
func (id *workloadIdentity) leaf(s *slot) (*x509.Certificate, error) {
	path := filepath.Join(id.dir(s), IdentityCertFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no CERTIFICATE block", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cert, nil
}

// key reads the private key in s's identity directory.
func (id *workloadIdentity) key(s *slot) (crypto.Signer, error) {
	path := filepath.Join(id.dir(s), IdentityKeyFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		// A workload started before its node minted identities has none
		// yet: it gets its first key now.
		key, _, err := identity.NewCSR()
		return key, err
	}
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: no PRIVATE KEY block", path)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	key, ok := parsed.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: a %T cannot sign", path, parsed)
	}
	return key, nil
}
