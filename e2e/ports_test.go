package e2e

import (
	"bufio"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/image"
)

// buildRedisImage packs this machine's redis-server (Debian's package)
// with the shared libraries it loads into an OCI layout under dir, and
// returns the pinned reference.
func buildRedisImage(t testing.TB, dir string) string {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server: %v (apt-get install -y redis-server redis-tools)", err)
	}
	out, err := exec.Command("ldd", server).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", server, err)
	}
	files := map[string]string{"/usr/bin/redis-server": server}
	// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and the
	// loader's "/lib64/ld-linux-x86-64.so.2 (0x...)": the absolute path
	// is where the binary looks, and the guest gets the file there.
	for _, m := range regexp.MustCompile(`(?m)(/\S+) \(0x`).FindAllStringSubmatch(string(out), -1) {
		files[m[1]] = m[1]
	}
	if len(files) < 3 {
		t.Fatalf("ldd %s found no libraries:\n%s", server, out)
	}
	layout := filepath.Join(dir, "redis-image")
	digest, err := image.BuildLayout(t.Context(), layout, image.LayoutSpec{
		Files: files,
		Dirs:  map[string]fs.FileMode{"/data": 0o755, "/tmp": fs.ModeSticky | 0o777},
		Config: v1.Config{
			Entrypoint: []string{"/usr/bin/redis-server"},
			WorkingDir: "/data",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return image.LayoutScheme + layout + "@" + digest.String()
}

func redisTemplate(pinned string) *torporv1.Template {
	return &torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "redis"}, Spec: &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers: []*torporv1.Container{{
			Name:  "redis",
			Image: pinned,
			// No persistence of its own: the actor's memory is the
			// snapshot.
			Args:           []string{"--port", "6379", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"},
			Port:           6379,
			ReadinessProbe: &torporv1.Probe{TcpSocket: &torporv1.TCPSocketAction{Port: 6379}, TimeoutSeconds: 30},
		}},
	}}
}

// apiToken makes an API token for space (created if missing), as an
// admin does.
func (c *cluster) apiToken(space string) string {
	c.t.Helper()
	_, err := torporv1connect.NewSpaceServiceClient(c.http, c.api).CreateSpace(c.ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{
		Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: space}},
	}))
	if err != nil && connect.CodeOf(err) != connect.CodeAlreadyExists {
		c.t.Fatalf("create space %s: %v", space, err)
	}
	resp, err := torporv1connect.NewIdentityServiceClient(c.http, c.api).CreateToken(c.ctx, connect.NewRequest(&torporv1.CreateTokenRequest{
		Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_API, Spaces: []string{space},
	}))
	if err != nil {
		c.t.Fatalf("API token for %s: %v", space, err)
	}
	return resp.Msg.GetToken()
}

// torporAs runs the torpor binary against c's API and router with token;
// the caller runs (or starts) it.
func (c *cluster) torporAs(token string, args ...string) *exec.Cmd {
	c.t.Helper()
	caFile := filepath.Join(c.t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, c.conn.CA, 0o644); err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(torporBinary(c.t), append([]string{"--server", c.api, "--ca", caFile}, args...)...)
	cmd.Env = append(os.Environ(), "TORPOR_TOKEN="+token, "TORPOR_ROUTER="+c.ingress)
	return cmd
}

// portForward starts `torpor actor port-forward` and returns the local
// address once it listens.
func (c *cluster) portForward(token, actor, ports string) string {
	c.t.Helper()
	cmd := c.torporAs(token, "actor", "port-forward", actor, ports)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // may have exited
		cmd.Wait()         //nolint:errcheck // killed
	})
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		if s.Scan() {
			line <- s.Text()
		}
		close(line)
	}()
	select {
	case l, ok := <-line:
		addr, found := strings.CutPrefix(l, "Forwarding from ")
		if !ok || !found {
			c.t.Fatalf("port-forward printed %q; stderr: %s", l, stderr.String())
		}
		return strings.Fields(addr)[0]
	case <-time.After(2 * time.Minute):
		c.t.Fatalf("port-forward does not listen; stderr: %s", stderr.String())
	}
	return ""
}

func redisCLI(t *testing.T, addr string, args ...string) string {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestRedisThroughPortForward: a real Redis server in an actor, reached
// with redis-cli through `torpor actor port-forward` (a tunnel through
// the router): keys written before a suspend are read after it, the
// tunnel waking the suspended actor. A token of another space opens no
// tunnel.
func TestRedisThroughPortForward(t *testing.T) {
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redis-cli: %v (apt-get install -y redis-tools)", err)
	}
	c := newCluster(t, clusterOptions{backend: "sqlite"})
	c.applyTemplate(redisTemplate(buildRedisImage(t, t.TempDir())))
	c.createActor("redis", "redis")
	token := c.apiToken("default")

	addr := c.portForward(token, "redis", "0:6379")
	if got := redisCLI(t, addr, "SET", "greeting", "hello from before the suspend"); got != "OK" {
		t.Fatalf("SET through the tunnel: %q", got)
	}
	if got := c.suspend("redis").GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("after suspend: %s", got)
	}
	if got := redisCLI(t, addr, "GET", "greeting"); got != "hello from before the suspend" {
		t.Fatalf("GET through the tunnel after a suspend: %q", got)
	}
	if got := c.actor("redis").GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("the tunnel left the actor %s, want RUNNING", got)
	}

	out, err := c.torporAs(c.apiToken("other"), "actor", "port-forward", "redis", "0:6379").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "403") || !strings.Contains(string(out), "no access to actor default/redis") {
		t.Fatalf("port-forward with a token of another space: %v\n%s\nwant a refusal (403)", err, out)
	}
	t.Logf("refused as expected: %s", strings.TrimSpace(string(out)))
}
