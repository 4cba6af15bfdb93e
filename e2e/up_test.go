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
)

// TestUpQuickstart runs `torpor up` as a user does and the README's
// quickstart against it, with the binary as built: the node and the router
// join the control plane on their own and talk mutual TLS; the client
// finds everything in the config `up` wrote. A second `up` on the same data
// directory needs no new tokens and has the actor back.
func TestUpQuickstart(t *testing.T) {
	runtimetest.RequireRoot(t)
	dataDir, configHome := shortTempDir(t), t.TempDir()
	api, routerAddr := freeAddr(t), freeAddr(t)
	suffix := randomHex(3)
	n := &nodeProcess{
		name: "e2u-" + suffix, stateDir: filepath.Join(dataDir, "node"), workers: 2,
		network: netns.Config{Bridge: "tu" + suffix, CIDR: fmt.Sprintf("10.%d.%d.0/24", 244+mrand.IntN(4), mrand.IntN(256))},
	}
	n.network.Node = n.name
	args := []string{"up", "--data-dir", dataDir, "--listen", api, "--router-listen", routerAddr, "--node-listen", freeAddr(t),
		"--node-name", n.name, "--workers", strconv.Itoa(n.workers), "--bridge", n.network.Bridge, "--cidr", n.network.CIDR, "--runsc", runtimetest.Runsc(t)}
	args = append(args, allowExamples(t)...)
	t.Setenv("XDG_CONFIG_HOME", configHome)
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(torporBinary(t), args...)
		cmd.Dir = moduleRoot(t)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("torpor %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	curl := func() string {
		t.Helper()
		out, err := exec.Command("curl", "-sS", "--max-time", "30", "-H", "Host: c1.default.actors.localhost", "http://"+routerAddr+"/").CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	start := func(name string) *process {
		t.Helper()
		p := startProcess(t, name, args...)
		if n.process == nil {
			t.Cleanup(func() { n.removeLeftovers(t) })
		}
		n.process = p
		waitForOutput(t, p, "Torpor is up.")
		return p
	}

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

// waitForOutput waits until p has printed text.
func waitForOutput(t *testing.T, p *process, text string) {
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
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(dir) // this package is e2e/ at the root
}
