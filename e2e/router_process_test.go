package e2e

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/testkit"
)

// torporCLI runs the torpor binary as an admin of c's API and returns its
// standard output.
func (c *cluster) torporCLI(args ...string) string {
	c.t.Helper()
	caFile := filepath.Join(c.t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, c.conn.CA, 0o644); err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(torporBinary(c.t), append([]string{"--server", c.api, "--ca", caFile}, args...)...)
	cmd.Env = append(os.Environ(), "TORPOR_TOKEN="+c.conn.Token)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		c.t.Fatalf("torpor %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// TestRouterProcessOverMutualTLS runs `torpor router` as its own process,
// joined as the admin's instructions say: a client join token for the
// router role, the CA pinned by fingerprint. It resumes an actor through
// the API with its certificate; restarted, it needs no token; once the
// admin deletes the client, the control plane refuses it.
func TestRouterProcessOverMutualTLS(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite"})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")

	var tok struct {
		Token         string `json:"token"`
		CaFingerprint string `json:"caFingerprint"`
	}
	out := c.torporCLI("token", "create", "--client", "edge", "--role", "router", "--spaces", "default", "-o", "json")
	if err := json.Unmarshal([]byte(out), &tok); err != nil || tok.Token == "" || tok.CaFingerprint == "" {
		t.Fatalf("token create printed %q (%v)", out, err)
	}
	stateDir, listen := t.TempDir(), testkit.FreeAddr(t)
	args := []string{"router", "--name", "edge", "--server", c.api, "--ca-fingerprint", tok.CaFingerprint,
		"--state-dir", stateDir, "--listen", listen}
	router := startProcess(t, "router", append(args, "--join-token", tok.Token)...)
	c.ingress = "http://" + listen
	// get waits for the router process to listen, then asks it for c1.
	get := func() (int, string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			conn, err := net.Dial("tcp", listen)
			if err == nil {
				conn.Close()
				code, _, body := c.routerGet("c1")
				return code, body
			}
			if !router.running() || time.Now().After(deadline) {
				t.Fatalf("the router process does not serve: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if code, body := get(); code != http.StatusOK || !strings.HasPrefix(body, "count=") {
		t.Fatalf("through the router process: %d %q, want the counter", code, body)
	}
	fi, err := os.Stat(filepath.Join(stateDir, "router-credentials.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("router credentials: %v (mode %v), want a 0600 file", err, fi.Mode().Perm())
	}
	if list := c.torporCLI("client", "list"); !strings.Contains(list, "edge") || !strings.Contains(list, "router") {
		t.Errorf("torpor client list:\n%s\nwant edge, a router", list)
	}

	// A restart uses the saved certificate: no token, and the API still
	// answers it (the suspended actor is resumed through the router).
	router.kill()
	c.suspend("c1")
	router = startProcess(t, "router-again", args...)
	if code, body := get(); code != http.StatusOK || !strings.HasPrefix(body, "count=") {
		t.Fatalf("through the restarted router: %d %q, want the counter", code, body)
	}

	// Revoked: the router's next call to the API is refused.
	c.torporCLI("client", "delete", "edge")
	c.suspend("c1")
	if code, body := get(); code == http.StatusOK || !strings.Contains(body, "join it with a new token") {
		t.Fatalf("through the revoked router: %d %q, want a refusal naming the deleted client", code, body)
	}
}
