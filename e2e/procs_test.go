package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

// torporBuild is the torpor binary, built once per test binary.
var torporBuild struct {
	once      sync.Once
	dir, path string
	err       error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if torporBuild.dir != "" {
		os.RemoveAll(torporBuild.dir)
	}
	os.Exit(code)
}

// torporBinary builds ./cmd/torpor from this checkout, so the processes
// under test are the code under test.
func torporBinary(t testing.TB) string {
	t.Helper()
	torporBuild.once.Do(func() {
		root, err := runtimetest.ModuleRoot()
		if err != nil {
			torporBuild.err = err
			return
		}
		if torporBuild.dir, err = os.MkdirTemp("", "torpor-e2e-bin-"); err != nil {
			torporBuild.err = err
			return
		}
		path := filepath.Join(torporBuild.dir, "torpor")
		cmd := exec.Command("go", "build", "-o", path, "./cmd/torpor")
		cmd.Dir = root
		// Static, as make build builds it: node agents run it inside
		// sandboxes too (the file helper).
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			torporBuild.err = fmt.Errorf("go build ./cmd/torpor: %w: %s", err, out)
			return
		}
		torporBuild.path = path
	})
	if torporBuild.err != nil {
		t.Fatal(torporBuild.err)
	}
	return torporBuild.path
}

// process is a torpor subcommand running as a child process. Its output
// goes to a log file that a failing test prints.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
}

func startProcess(t testing.TB, name string, args ...string) *process {
	t.Helper()
	return startProcessOf(t, torporBinary(t), name, args...)
}

// startProcessOf runs bin, a torpor binary (this checkout's, or an
// earlier version's for the upgrade tests), as startProcess does.
func startProcessOf(t testing.TB, bin, name string, args ...string) *process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start torpor %s: %v", strings.Join(args, " "), err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		cmd.Wait() //nolint:errcheck // a killed process exits with an error by design
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("output of %s (%s):\n%s", name, strings.Join(args, " "), tail(logPath, 8<<10))
		}
	})
	return p
}

// kill sends SIGKILL and waits for the process to be gone: no shutdown
// path of its own runs.
func (p *process) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

func (p *process) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s to %s: %v", sig, p.name, err)
	}
}

func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func tail(path string, limit int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > limit {
		_, _ = f.Seek(fi.Size()-limit, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// allowExamples are the flags that let a torpor server, node or up read
// the examples' images, as `make up` passes them.
func allowExamples(t testing.TB) []string {
	t.Helper()
	root, err := runtimetest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return []string{"--allow-image-dir", filepath.Join(root, "examples")}
}

// serverProcess runs `torpor server` on addr with args, its admin token
// and CA written into dir, waits until it serves, and returns it with the
// connection an admin uses. A restart on the same store and dir has the
// same CA and admin token.
func serverProcess(t testing.TB, dir, addr string, args ...string) (*process, client.Connection) {
	t.Helper()
	return serverProcessOf(t, torporBinary(t), dir, addr, args...)
}

// serverProcessOf is serverProcess running bin.
func serverProcessOf(t testing.TB, bin, dir, addr string, args ...string) (*process, client.Connection) {
	t.Helper()
	tokenFile, caFile := filepath.Join(dir, "admin-token"), filepath.Join(dir, "ca.pem")
	args = append(append([]string{"server", "--listen", addr, "--admin-token-file", tokenFile, "--ca-file", caFile}, allowExamples(t)...), args...)
	p := startProcessOf(t, bin, "server", args...)
	conn := client.Connection{Server: "https://" + addr}
	deadline := time.Now().Add(time.Minute)
	for {
		if err := p.serving(&conn, tokenFile, caFile); err == nil {
			return p, conn
		} else if !p.running() {
			t.Fatalf("torpor server exited before it served: %v", err)
		} else if time.Now().After(deadline) {
			t.Fatalf("torpor server did not serve %s within a minute: %v", conn.Server, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serving reads the server's client files into conn and checks that the
// server answers over TLS with a certificate of that CA.
func (p *process) serving(conn *client.Connection, tokenFile, caFile string) error {
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		return err
	}
	if conn.CA, err = os.ReadFile(caFile); err != nil {
		return err
	}
	conn.Token = strings.TrimSpace(string(token))
	hc, err := conn.HTTPClient()
	if err != nil {
		return err
	}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(conn.Server + "/healthz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/healthz: %s", resp.Status)
	}
	return nil
}

// apiCluster is a cluster view over a control plane the test does not run
// itself: only the API clients are set.
func apiCluster(t *testing.T, conn client.Connection) *cluster {
	c := &cluster{t: t, ctx: context.Background(), api: conn.Server}
	c.connect(conn)
	return c
}

func (c *cluster) nodeClient() torporv1connect.NodeServiceClient {
	return torporv1connect.NewNodeServiceClient(c.http, c.api)
}

// waitForWorkers waits until node has registered n workers.
func (c *cluster) waitForWorkers(node string, n int) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("%d workers of node %s", n, node), func() bool {
		count := 0
		for _, w := range c.listWorkers() {
			if w.GetSpec().GetNode() == node {
				count++
			}
		}
		return count == n
	})
}

func (c *cluster) listWorkers() []*torporv1.Worker {
	c.t.Helper()
	var all []*torporv1.Worker
	req := &torporv1.ListRequest{}
	for {
		resp, err := c.workers.ListWorkers(c.ctx, connect.NewRequest(req))
		if err != nil {
			c.t.Fatal(err)
		}
		all = append(all, resp.Msg.GetWorkers()...)
		if req.PageToken = resp.Msg.GetNextPageToken(); req.PageToken == "" {
			return all
		}
	}
}

func (c *cluster) listActors() []*torporv1.Actor {
	c.t.Helper()
	var all []*torporv1.Actor
	req := &torporv1.ListRequest{}
	for {
		resp, err := c.actors.ListActors(c.ctx, connect.NewRequest(req))
		if err != nil {
			c.t.Fatal(err)
		}
		all = append(all, resp.Msg.GetActors()...)
		if req.PageToken = resp.Msg.GetNextPageToken(); req.PageToken == "" {
			return all
		}
	}
}

func (c *cluster) worker(ref *torporv1.WorkerRef) *torporv1.Worker {
	c.t.Helper()
	resp, err := c.workers.GetWorker(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: ref.GetNamespace(), Name: ref.GetName()}))
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.Msg
}

// checkReciprocal fails the test unless placement is reciprocal
// (invariant 1): every worker naming an actor is named back by it, and
// every actor naming a worker is named back by it.
func (c *cluster) checkReciprocal() {
	c.t.Helper()
	workers := map[string]*torporv1.Worker{}
	for _, w := range c.listWorkers() {
		workers[w.GetMetadata().GetSpace()+"/"+w.GetMetadata().GetName()] = w
	}
	actors := map[string]*torporv1.Actor{}
	for _, a := range c.listActors() {
		actors[a.GetMetadata().GetSpace()+"/"+a.GetMetadata().GetName()] = a
	}
	for key, w := range workers {
		ref := w.GetStatus().GetActor()
		if ref == nil {
			continue
		}
		a := actors[ref.GetSpace()+"/"+ref.GetName()]
		if a == nil || a.GetMetadata().GetUid() != ref.GetUid() || a.GetStatus().GetWorker().GetUid() != w.GetMetadata().GetUid() {
			c.t.Errorf("worker %s names actor %s/%s (uid %s), which does not name it back: %v", key, ref.GetSpace(), ref.GetName(), ref.GetUid(), a.GetStatus())
		}
	}
	for key, a := range actors {
		ref := a.GetStatus().GetWorker()
		if ref == nil {
			continue
		}
		w := workers[ref.GetNamespace()+"/"+ref.GetName()]
		if w == nil || w.GetMetadata().GetUid() != ref.GetUid() || w.GetStatus().GetActor().GetUid() != a.GetMetadata().GetUid() {
			c.t.Errorf("actor %s (%s) names worker %s/%s, which does not name it back: %v", key, a.GetStatus().GetState(), ref.GetNamespace(), ref.GetName(), w.GetStatus())
		}
	}
}
