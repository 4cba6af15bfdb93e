package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// TestE2BSDK drives `torpor up` with the published E2B SDK itself, both
// path generations (npm e2b 2.51.0 and 2.50.0, pinned in e2e/e2b's
// package-lock.json and installed with npm ci): the scenarios of
// e2e/e2b/sdk.test.mjs, on real gVisor, through the E2B listener and the
// router, with keys made by the CLI.
func TestE2BSDK(t *testing.T) {
	e := startE2B(t)
	// Plain HTTP with both generations: the API on --e2b-listen, the
	// in-sandbox API through the router's plain port and the sandbox
	// headers (E2B_SANDBOX_URL). Then HTTPS as the SDK uses it by
	// default: the API on the API port, https://<port>-<id>.<domain> to
	// the router's TLS port with its certificate for *.<domain> from the
	// installation's CA, the names resolved to the router as a wildcard
	// DNS record would.
	https := []string{
		"E2B_API_URL=https://" + e.up.api,
		"E2B_SANDBOX_URL=",
		"NODE_EXTRA_CA_CERTS=" + filepath.Join(e.up.dataDir, "ca.pem"),
		"TORPOR_E2B_RESOLVE=" + e2bDomain,
	}
	for _, run := range []struct {
		name, sdk string
		env       []string
	}{
		{"e2b", "e2b", nil},
		{"e2b-2.50", "e2b-2.50", nil},
		{"e2b-https", "e2b", https},
	} {
		t.Run(run.name, func(t *testing.T) {
			out, err := e.node(run.sdk, run.env, "--test", "--test-reporter=spec", "--test-concurrency=1", "sdk.test.mjs")
			t.Logf("node --test sdk.test.mjs (%s):\n%s", run.name, out)
			if err != nil {
				t.Fatalf("the E2B SDK's scenarios failed (%s): %v", run.name, err)
			}
		})
	}
	for _, sdk := range []string{"e2b", "e2b-2.50"} {
		t.Run("egress-"+sdk, func(t *testing.T) { testE2BEgress(t, e, sdk) })
	}
}

// testE2BEgress: a sandbox the SDK creates with network.allowOut and
// denyOut ALL_TRAFFIC runs under the allowlist of its entries, TCP and
// UDP on every port (its running workload's policy, as actor describe
// shows it); what cannot be honoured is refused with the SDK's error
// naming the entry (e2e/e2b/egress.mjs asserts those).
func testE2BEgress(t *testing.T, e *e2bInstallation, sdk string) {
	out, err := e.node(sdk, nil, "egress.mjs")
	if err != nil {
		t.Fatalf("egress.mjs (%s): %v\n%s", sdk, err, out)
	}
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	var res struct {
		SandboxID string   `json:"sandboxId"`
		Refusals  []string `json:"refusals"`
	}
	if err := json.Unmarshal(lines[len(lines)-1], &res); err != nil {
		t.Fatalf("egress.mjs printed %q: %v", out, err)
	}
	t.Logf("refusals the SDK reported:\n%s", strings.Join(res.Refusals, "\n"))
	describe := e.up.cli("actor", "describe", res.SandboxID)
	const want = "Egress:  allowlist: tcp api.example.com:*, udp api.example.com:*, tcp 198.51.100.7/32:*, udp 198.51.100.7/32:* (the running workload's)"
	if !strings.Contains(describe, want) {
		t.Errorf("actor describe %s:\n%s\nwant the line %q", res.SandboxID, describe, want)
	}
	e.up.cli("actor", "delete", res.SandboxID, "--force")
}

// e2bInstallation is `torpor up` with its E2B listener, a template "base"
// of buildE2BImage in space "default", a space "other", and an E2B key of
// each; node runs the SDK's scripts in e2e/e2b against it.
type e2bInstallation struct {
	up       *upInstance
	dir      string
	api      string
	key      string
	otherKey string
}

func startE2B(t testing.TB) *e2bInstallation {
	t.Helper()
	e := &e2bInstallation{dir: filepath.Join(moduleRoot(t), "e2e", "e2b"), api: testkit.FreeAddr(t)}
	npmCI(t, e.dir)
	images := t.TempDir()
	pinned := buildE2BImage(t, images)
	// Sandboxes are not evicted within their leases: a worker each for
	// the scenarios' sandboxes alive at once.
	e.up = newUp(t, 4, "--e2b-listen", e.api, "--allow-image-dir", images)
	// The domain the API answers with carries the router's HTTPS port,
	// where the SDK's own https:// URLs go.
	_, tlsPort, err := net.SplitHostPort(e.up.routerTLS)
	if err != nil {
		t.Fatal(err)
	}
	e.up.args = append(e.up.args, "--e2b-domain", e2bDomain+":"+tlsPort)
	e.up.start("up")

	templateFile := filepath.Join(t.TempDir(), "base.yaml")
	writeFile(t, templateFile, fmt.Sprintf(`apiVersion: torpor.dev/v1
kind: Template
metadata:
  name: base
spec:
  sandboxClass: gvisor
  containers:
    - name: main
      image: %s
      command: ["/bin/sleep", "infinity"]
  # What a sandbox's network.allowOut narrows (e2e/e2b/egress.mjs); no
  # scenario dials out.
  egress:
    mode: ALLOWLIST
    rules:
      - {host: "*.example.com", protocol: TCP}
      - {host: "*.example.com", protocol: UDP}
      - {cidr: 198.51.100.0/24, protocol: TCP}
      - {cidr: 198.51.100.0/24, protocol: UDP}
`, pinned))
	e.up.cli("template", "apply", "-f", templateFile, "--wait")
	// The keys' sandboxes may name addresses of this range (egress.mjs).
	e.up.cli("space", "update", "default", "--egress-cidr", "198.51.100.0/24")
	e.up.cli("space", "create", "other")
	e.key = e2bKey(t, e.up.cli("token", "create", "--spaces", "default", "--e2b"))
	e.otherKey = e2bKey(t, e.up.cli("token", "create", "--spaces", "other", "--e2b"))
	return e
}

// node runs node with args in e2e/e2b, the SDK package sdk pointed at the
// installation (the variables sdk.test.mjs documents) and env added.
func (e *e2bInstallation) node(sdk string, env []string, args ...string) ([]byte, error) {
	cmd := exec.Command("node", args...)
	cmd.Dir = e.dir
	cmd.Env = append(os.Environ(),
		"TORPOR_E2B_SDK="+sdk,
		"E2B_API_URL=http://"+e.api,
		"E2B_API_KEY="+e.key,
		"E2B_SANDBOX_URL=http://"+e.up.router,
		"TORPOR_E2B_TEMPLATE=base",
		"TORPOR_E2B_OTHER_KEY="+e.otherKey,
		"TORPOR_ROUTER="+e.up.router,
	)
	cmd.Env = append(cmd.Env, env...)
	return cmd.CombinedOutput()
}

// e2bDomain is the router's domain under torpor up.
const e2bDomain = "actors.localhost"

var e2bKeyPattern = regexp.MustCompile(`e2b_[0-9a-f]{64}`)

// e2bKey is the key `torpor token create --e2b` printed.
func e2bKey(t testing.TB, out string) string {
	t.Helper()
	k := e2bKeyPattern.FindString(out)
	if k == "" {
		t.Fatalf("torpor token create --e2b printed no e2b_<hex> key:\n%s", out)
	}
	return k
}

// npmCI installs the SDK as package-lock.json pins it.
func npmCI(t testing.TB, dir string) {
	t.Helper()
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s (Node.js 20 and the npm registry are needed): %v\n%s", dir, err, out)
	}
}

func writeFile(t testing.TB, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// buildE2BImage packs an image as E2B programs expect of a sandbox: bash
// (the SDK runs every command with bash -l -c), the usual tools and
// python3 with its HTTP server, from this machine's Debian programs.
func buildE2BImage(t testing.TB, dir string) string {
	t.Helper()
	files := map[string]string{}
	programs := map[string]string{"/bin/bash": "bash", "/bin/sh": "dash"}
	for _, name := range []string{"cat", "ls", "mkdir", "sleep", "env", "rm", "mv", "echo", "true", "false", "head", "id", "stty"} {
		programs["/bin/"+name] = name
	}
	addPrograms(t, files, programs)
	addPythonStdlib(t, files)
	layout := filepath.Join(dir, "e2b-image")
	digest, err := image.BuildLayout(t.Context(), layout, image.LayoutSpec{
		Files: files,
		Dirs: map[string]fs.FileMode{
			"/tmp": fs.ModeSticky | 0o777, "/home/user": 0o755,
		},
		Config: v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return image.LayoutScheme + layout + "@" + digest.String()
}
