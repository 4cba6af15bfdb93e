package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// previousVersion is the commit of main the upgrade tests upgrade from:
// the one previous version an installation may be upgraded from (and may
// run beside the current code while it is), as docs/operations.md says.
const previousVersion = "2af8816"

var previousBuild struct {
	once sync.Once
	path string
	err  error
}

// previousTorpor returns the torpor binary of previousVersion, built from
// this repository's history. It is kept under bin/old/COMMIT/ (which make
// clean removes), so the next run does not build it again.
func previousTorpor(t testing.TB) string {
	t.Helper()
	previousBuild.once.Do(func() {
		previousBuild.path, previousBuild.err = buildCommit(previousVersion)
	})
	if previousBuild.err != nil {
		t.Fatal(previousBuild.err)
	}
	return previousBuild.path
}

// buildCommit builds ./cmd/torpor as of commit (from a git archive of it,
// with this machine's module and build caches) unless it is built already.
func buildCommit(commit string) (string, error) {
	root, err := runtimetest.ModuleRoot()
	if err != nil {
		return "", err
	}
	path := filepath.Join(root, "bin", "old", commit, "torpor")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if out, err := exec.Command("git", "-C", root, "rev-parse", "--verify", "--quiet", commit+"^{commit}").CombinedOutput(); err != nil {
		return "", fmt.Errorf("commit %s is not in the history of %s (%v %s): a shallow clone? fetch the full history (git fetch --unshallow) to run the upgrade tests", commit, root, err, out)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	work, err := os.MkdirTemp(filepath.Dir(path), "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	src := filepath.Join(work, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return "", err
	}
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
	untar := exec.Command("tar", "-x", "-C", src)
	if untar.Stdin, err = archive.StdoutPipe(); err != nil {
		return "", err
	}
	if err := untar.Start(); err != nil {
		return "", fmt.Errorf("tar -x of commit %s: %w", commit, err)
	}
	var archiveErr strings.Builder
	archive.Stderr = &archiveErr
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return "", fmt.Errorf("git archive %s: %w: %s", commit, err, archiveErr.String())
	}
	if err := untar.Wait(); err != nil {
		return "", fmt.Errorf("tar -x of commit %s: %w", commit, err)
	}
	built := filepath.Join(work, "torpor")
	build := exec.Command("go", "build", "-o", built, "./cmd/torpor")
	build.Dir = src
	// Static, as make build builds it (and torporBinary).
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/torpor of commit %s: %w: %s", commit, err, out)
	}
	// A rename: a run cut short leaves no half-written binary to trust.
	if err := os.Rename(built, path); err != nil {
		return "", fmt.Errorf("torpor of commit %s: %w", commit, err)
	}
	return path, nil
}

// balancer is a TCP load balancer in front of the server replicas, as an
// installation of several has one: each connection goes to the next
// replica that accepts it, so a replica's restart costs its clients a
// reconnect, not an outage.
type balancer struct {
	ln       net.Listener
	backends []string
	next     atomic.Uint32
	wg       sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// startBalancer listens on a free loopback port until the test ends.
func startBalancer(t testing.TB, backends ...string) *balancer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &balancer{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}}
	b.wg.Go(b.serve)
	t.Cleanup(b.stop)
	return b
}

func (b *balancer) addr() string { return b.ln.Addr().String() }

func (b *balancer) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.wg.Go(func() { b.relay(c) })
	}
}

// relay pipes c to the first backend that accepts a connection, from the
// next one in turn.
func (b *balancer) relay(c net.Conn) {
	if !b.track(c) {
		return
	}
	defer b.untrack(c)
	first := int(b.next.Add(1))
	for i := range b.backends {
		up, err := net.DialTimeout("tcp", b.backends[(first+i)%len(b.backends)], time.Second)
		if err != nil {
			continue
		}
		if !b.track(up) {
			return
		}
		defer b.untrack(up)
		var copies sync.WaitGroup
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			// Either side's end ends both: TLS has no half-close.
			c.Close()
			up.Close()
		}
		copies.Go(func() { pipe(up, c) })
		copies.Go(func() { pipe(c, up) })
		copies.Wait()
		return
	}
}

// track records a connection for stop to close, or closes it if the
// balancer is stopping.
func (b *balancer) track(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conns == nil {
		c.Close()
		return false
	}
	b.conns[c] = struct{}{}
	return true
}

func (b *balancer) untrack(c net.Conn) {
	c.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.conns, c)
}

func (b *balancer) stop() {
	b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.conns = nil
	b.mu.Unlock()
	b.wg.Wait()
}

// refused says whether err is a refused connection: a load balancer
// tries the next backend, as the upgrade tests' clients do.
func refused(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
