package e2e

import (
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/netns"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// TestUpQuickstart runs `torpor up` as a user does and the README's
// quickstart against it, with the binary as built: the node and the router
// join the control plane on their own and talk mutual TLS; the client
// finds everything in the config `up` wrote. A second `up` on the same data
// directory needs no new tokens and has the actor back.
func TestUpQuickstart(t *testing.T) {
	u := newUp(t, 2)
	cli, start, routerAddr := u.cli, u.start, u.router
	curl := func() string {
		t.Helper()
		out, err := exec.Command("curl", "-sS", "--max-time", "30", "-H", "Host: c1.default.actors.localhost", "http://"+routerAddr+"/").CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	dataDir := u.dataDir

	up := start("up")
	cli("template", "apply", "-f", "examples/counter/template.yaml", "--wait")
	cli("actor", "create", "c1", "--template", "counter")
	for i, want := range []string{"count=1 lines=1", "count=2 lines=2"} {
		if got := curl(); got != want {
			t.Fatalf("curl %d: %q, want %q", i+1, got, want)
		}
	}
	cli("actor", "suspend", "c1")
	if got := curl(); got != "count=3 lines=3" {
		t.Fatalf("curl after the suspend: %q, want count=3 lines=3", got)
	}
	if list := cli("client", "list"); !strings.Contains(list, "router") {
		t.Errorf("torpor client list:\n%s\nwant the router", list)
	}

	up.signal(t, syscall.SIGINT)
	select {
	case <-up.exited:
	case <-time.After(2 * time.Minute):
		t.Fatal("torpor up did not stop within 2 minutes of Ctrl-C")
	}
	if out := tail(up.logPath, 4096); !strings.Contains(out, "Suspended 1 actor(s).") {
		t.Errorf("torpor up's shutdown:\n%s\nwant one actor suspended", out)
	}
	if left := processesMentioning(t, dataDir); len(left) > 0 {
		t.Errorf("processes left after torpor up stopped: %v", left)
	}

	start("up-again")
	if got := curl(); got != "count=4 lines=4" {
		t.Fatalf("curl after a restart of torpor up: %q, want count=4 lines=4", got)
	}
}

// upInstance is `torpor up` as a user runs it, on ports, a bridge and a
// data directory of its own, with the CLI configured by it.
type upInstance struct {
	t       testing.TB
	node    *nodeProcess
	args    []string
	dataDir string
	api     string
	router  string
	// routerTLS is the router's HTTPS address (E2B sandboxes).
	routerTLS string
}

// newUp prepares `torpor up` with workers and extra flags; start runs
// it.
func newUp(t testing.TB, workers int, extra ...string) *upInstance {
	t.Helper()
	runtimetest.RequireRoot(t)
	u := &upInstance{t: t, dataDir: shortTempDir(t), api: testkit.FreeAddr(t), router: testkit.FreeAddr(t), routerTLS: testkit.FreeAddr(t)}
	suffix := randomHex(3)
	u.node = &nodeProcess{
		name: "e2u-" + suffix, stateDir: filepath.Join(u.dataDir, "node"), workers: workers,
		network: netns.Config{Bridge: "tu" + suffix, CIDR: fmt.Sprintf("10.%d.%d.0/24", 244+mrand.IntN(4), mrand.IntN(256))},
	}
	u.node.network.Node = u.node.name
	u.args = []string{"up", "--data-dir", u.dataDir, "--listen", u.api, "--router-listen", u.router, "--router-tls-listen", u.routerTLS, "--node-listen", testkit.FreeAddr(t),
		"--node-name", u.node.name, "--workers", strconv.Itoa(u.node.workers), "--bridge", u.node.network.Bridge, "--cidr", u.node.network.CIDR, "--runsc", runtimetest.Runsc(t)}
	u.args = append(u.args, allowExamples(t)...)
	u.args = append(u.args, extra...)
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	return u
}

// start runs `torpor up` (again, after a stop) and waits until it is up.
func (u *upInstance) start(name string) *process {
	u.t.Helper()
	p := startProcess(u.t, name, u.args...)
	if u.node.process == nil {
		u.t.Cleanup(func() { u.node.removeLeftovers(u.t) })
	}
	u.node.process = p
	waitForOutput(u.t, p, "Torpor is up.")
	return p
}

// cli runs the torpor CLI, configured by up, from the repository's root.
func (u *upInstance) cli(args ...string) string {
	u.t.Helper()
	cmd := exec.Command(torporBinary(u.t), args...)
	cmd.Dir = moduleRoot(u.t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		u.t.Fatalf("torpor %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// waitForOutput waits until p has printed text.
func waitForOutput(t testing.TB, p *process, text string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(tail(p.logPath, 1<<20), text) {
		if !p.running() || time.Now().After(deadline) {
			t.Fatalf("%s did not print %q:\n%s", p.name, text, tail(p.logPath, 8<<10))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// moduleRoot is the repository, where the README's relative paths start.
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(dir) // this package is e2e/ at the root
}
