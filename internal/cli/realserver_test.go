package cli

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/identity"
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/server"
)

// TestAgainstRealServer drives the control plane (SQLite store) through
// the command line, so the client and the server agree on the API's
// meaning, not only its shape.
func TestAgainstRealServer(t *testing.T) {
	isolate(t)
	_, url := realServer(t, server.Options{})

	dir, pinned := imageDir(t)
	file := filepath.Join(dir, "counter.yaml")
	if err := os.WriteFile(file, []byte(goodTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	equalText(t, "apply", ok(t, url, "template", "apply", "-f", file), "template/counter created\n")
	equalText(t, "apply again", ok(t, url, "template", "apply", "-f", file), "template/counter unchanged\n")
	var tmpl torporv1.Template
	decodeAs(t, formatJSON, ok(t, url, "template", "get", "counter", "-o", "json"), &tmpl)
	if got := tmpl.GetSpec().GetContainers()[0].GetImage(); got != pinned {
		t.Errorf("stored image %q, want %q", got, pinned)
	}
	equalText(t, "create actor", ok(t, url, "actor", "create", "c1", "--template", "counter", "--selector", "pool=small"), "actor/c1 created\n")
	if r := torpor(t, url, "actor", "create", "c0", "--template", "counter@1"); r.code != 0 || !strings.Contains(r.stderr, "note: the golden snapshot of template/counter@1 is PENDING") {
		t.Errorf("create on a revision still building: exit %d, stderr %q, want a note", r.code, r.stderr)
	}
	if msg := fails(t, url, "actor", "create", "c2", "--template", "missing"); !strings.HasPrefix(msg, "Error: ") || !strings.Contains(msg, "missing") {
		t.Errorf("actor of a missing template: %q", msg)
	}
	changed := filepath.Join(dir, "changed.yaml")
	if err := os.WriteFile(changed, []byte(strings.Replace(goodTemplate, "keep: 3", "keep: 4", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	equalText(t, "changed template", ok(t, url, "template", "apply", "-f", changed),
		"template/counter revised: revision 2 (actors on older revisions stay there until moved: torpor template rollout counter)\n")
	equalText(t, "changed template again", ok(t, url, "template", "apply", "-f", changed), "template/counter unchanged\n")
	history := ok(t, url, "template", "history", "counter")
	var rows []string
	for _, line := range strings.Split(strings.TrimSpace(history), "\n") {
		f := strings.Fields(line)
		rows = append(rows, strings.Join(f[:min(len(f), 4)], " "))
	}
	if want := []string{"REVISION PHASE ACTORS UID", "counter@1 PENDING 2", "counter@2 (latest) PENDING"}; len(rows) != 3 || rows[0] != want[0] || !strings.HasPrefix(rows[1], want[1]) || !strings.HasPrefix(rows[2], want[2]+" 0") {
		t.Errorf("history:\n%s", history)
	}
	if msg := fails(t, url, "template", "delete", "counter"); !strings.Contains(msg, "failed_precondition") || !strings.Contains(msg, "counter@1 is used by 2 actor(s) (c0, c1)") {
		t.Errorf("delete of a template in use: %q", msg)
	}
	if msg := fails(t, url, "template", "rebuild", "counter"); !strings.Contains(msg, "only a FAILED golden build is rebuilt") {
		t.Errorf("rebuild of a pending revision: %q", msg)
	}
	equalText(t, "move one actor", ok(t, url, "actor", "update", "c0", "--template", "counter@2"), "actor/c0 updated\n")
	equalText(t, "rollout", ok(t, url, "template", "rollout", "counter"), "actor/c1 moved from counter@1 to counter@2\n")
	equalText(t, "rollout again", ok(t, url, "template", "rollout", "counter"), "every actor of template/counter is on counter@2\n")
	equalText(t, "update", ok(t, url, "actor", "update", "c1", "--selector", "pool=big,zone=z1"), "actor/c1 updated\n")
	var actor torporv1.Actor
	decodeAs(t, formatYAML, ok(t, url, "actor", "get", "c1", "-o", "yaml"), &actor)
	if actor.GetMetadata().GetVersion() < 2 || len(actor.GetSpec().GetWorkerSelector()) != 2 || actor.GetSpec().GetWorkerSelector()["zone"] != "z1" || actor.GetSpec().GetTemplateRevision() != 2 {
		t.Errorf("after update: %v", &actor)
	}
	list := ok(t, url, "actor", "list")
	if lines := strings.Split(strings.TrimSpace(list), "\n"); len(lines) != 3 ||
		strings.Join(strings.Fields(lines[0]), " ") != "NAME TEMPLATE STATE WORKER AGE" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[2]), " "), "c1 counter@2 SUSPENDED <none> ") {
		t.Errorf("actor list:\n%s", list)
	}

	equalText(t, "delete the older revision", ok(t, url, "template", "delete", "counter@1"), "template/counter@1 deleted\n")
	equalText(t, "delete actors", ok(t, url, "actor", "delete", "c0", "c1"), "actor/c0 deleted\nactor/c1 deleted\n")
	if msg := fails(t, url, "actor", "get", "c1"); !strings.HasPrefix(msg, "Error: not_found: ") {
		t.Errorf("deleted actor: %q", msg)
	}
	equalText(t, "delete template", ok(t, url, "template", "delete", "counter"), "template/counter deleted\n")
}

// realServer starts a control plane on a fresh SQLite store as `torpor
// server` does (server.Start) until t ends, and points the CLI at it the
// way `torpor up` does: a client config with its URL, CA and the admin
// token. It returns the server and the API's URL.
func realServer(t *testing.T, opts server.Options) (*server.Server, string) {
	t.Helper()
	data := t.TempDir()
	opts.Store = "sqlite:" + filepath.Join(data, "torpor.db")
	opts.Snapshots = filepath.Join(data, "snapshots")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts.Listener = ln
	opts.Logger = slog.New(slog.DiscardHandler)
	opts.Images = runtimetest.ImagePolicy(t)
	cp, err := server.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop the control plane: %v", err)
		}
	})
	path, err := client.ConfigPath()
	if err != nil {
		t.Fatal(err)
	}
	if err := client.WriteConfig(path, client.Config{Server: cp.URL, CA: string(cp.CAPEM), Token: cp.AdminToken}); err != nil {
		t.Fatal(err)
	}
	return cp.Server, cp.URL
}

// TestTokensAgainstRealServer: the admin (the config) makes an API token
// for one space, which reaches that space only, and a node join token
// with the CA fingerprint to pin.
func TestTokensAgainstRealServer(t *testing.T) {
	isolate(t)
	ctx := context.Background()
	srv, url := realServer(t, server.Options{})
	a, err := srv.Authority(ctx)
	if err != nil {
		t.Fatal(err)
	}

	ok(t, url, "space", "create", "other")
	var created torporv1.CreateTokenResponse
	decodeAs(t, formatJSON, ok(t, url, "token", "create", "--spaces", "default", "--ttl", "1h", "-o", "json"), &created)
	if !strings.HasPrefix(created.GetToken(), "torpor-") || time.Until(created.GetExpireTime().AsTime()) > time.Hour {
		t.Fatalf("API token %v, want a torpor token for an hour", &created)
	}
	if r := torpor(t, url, "--token", created.GetToken(), "actor", "list"); r.code != 0 || r.stderr != "No actors found.\n" {
		t.Errorf("the token's space: exit %d, stderr %q", r.code, r.stderr)
	}
	if msg := fails(t, url, "--token", created.GetToken(), "actor", "list", "--space", "other"); !strings.HasPrefix(msg, "Error: permission_denied: ") {
		t.Errorf("another space with the token: %q", msg)
	}
	if msg := fails(t, url, "--token", created.GetToken(), "token", "create", "--spaces", "default"); !strings.HasPrefix(msg, "Error: permission_denied: ") {
		t.Errorf("token creation with an API token: %q", msg)
	}
	if msg := fails(t, url, "--token", "torpor-forged", "actor", "list"); !strings.HasPrefix(msg, "Error: unauthenticated: ") {
		t.Errorf("forged token: %q", msg)
	}

	// An E2B key is an API token of its one space, for the CLI too.
	var key torporv1.CreateTokenResponse
	decodeAs(t, formatJSON, ok(t, url, "token", "create", "--spaces", "default", "--e2b", "-o", "json"), &key)
	if !regexp.MustCompile(`^e2b_[0-9a-f]{64}$`).MatchString(key.GetToken()) || time.Until(key.GetExpireTime().AsTime()) < 364*24*time.Hour {
		t.Fatalf("E2B key %v, want e2b_<64 hex> for a year", &key)
	}
	if r := torpor(t, url, "--token", key.GetToken(), "actor", "list"); r.code != 0 || r.stderr != "No actors found.\n" {
		t.Errorf("the E2B key's space: exit %d, stderr %q", r.code, r.stderr)
	}
	if msg := fails(t, url, "--token", key.GetToken(), "actor", "list", "--space", "other"); !strings.HasPrefix(msg, "Error: permission_denied: ") {
		t.Errorf("another space with the E2B key: %q", msg)
	}
	if tokens := ok(t, url, "token", "list"); !strings.Contains(tokens, key.GetId()[:12]) || !strings.Contains(tokens, "E2B") {
		t.Errorf("token list does not show the E2B key %s:\n%s", key.GetId()[:12], tokens)
	}
	for _, args := range [][]string{
		{"token", "create", "--e2b"},
		{"token", "create", "--e2b", "--spaces", "default,other"},
		{"token", "create", "--e2b", "--node", "n1"},
	} {
		if msg := fails(t, url, args...); !strings.Contains(msg, "--e2b") {
			t.Errorf("%v: %q, want an error naming --e2b", args, msg)
		}
	}

	join := ok(t, url, "token", "create", "--node", "n1")
	if !strings.Contains(join, "ca-fingerprint: "+a.CAFingerprint()) || !strings.Contains(join, "--ca-fingerprint "+a.CAFingerprint()) {
		t.Errorf("join token output lacks the CA fingerprint %s:\n%s", a.CAFingerprint(), join)
	}
	for _, args := range [][]string{
		{"token", "create"},
		{"token", "create", "--node", "n1", "--spaces", "a"},
	} {
		if msg := fails(t, url, args...); !strings.Contains(msg, "--node") {
			t.Errorf("%v: %q, want an error naming --node", args, msg)
		}
	}
}

// TestLoginAgainstRealServer: the CLI spends a client join token on a
// certificate and then authenticates with it alone (the config keeps no
// token), within the client's spaces; it renews the certificate when two
// thirds of its life have passed; a deleted client is refused.
func TestLoginAgainstRealServer(t *testing.T) {
	isolate(t)
	ctx := context.Background()
	srv, url := realServer(t, server.Options{MemberCertTTL: 10 * time.Second})
	ok(t, url, "space", "create", "other")
	var created torporv1.CreateTokenResponse
	decodeAs(t, formatJSON, ok(t, url, "token", "create", "--client", "dev", "--role", "user", "--spaces", "default", "-o", "json"), &created)

	admin, err := srv.AdminToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var unused torporv1.CreateTokenResponse
	decodeAs(t, formatJSON, ok(t, url, "token", "create", "--node", "n9", "-o", "json"), &unused)
	tokens := ok(t, url, "token", "list")
	for _, want := range []string{created.GetId()[:12] + " CLIENT_JOIN dev user default", unused.GetId()[:12] + " NODE_JOIN n9"} {
		if !strings.Contains(strings.Join(strings.Fields(tokens), " "), want) {
			t.Errorf("token list:\n%s\nwant a row %q", tokens, want)
		}
	}
	equalText(t, "revoke", ok(t, url, "token", "revoke", unused.GetId()[:12]), "token "+unused.GetId()[:12]+" (node_join) revoked\n")
	if tokens := ok(t, url, "token", "list"); strings.Contains(tokens, unused.GetId()[:12]) {
		t.Errorf("token list after the revocation:\n%s", tokens)
	}

	if msg := fails(t, url, "login", "--name", "dev", "--join-token", created.GetToken()); !strings.Contains(msg, "--ca-fingerprint") {
		t.Errorf("login without a pinned CA: %q", msg)
	}
	out := ok(t, url, "login", "--name", "dev", "--join-token", created.GetToken(), "--ca-fingerprint", created.GetCaFingerprint())
	if !strings.Contains(out, "spiffe://torpor.local/client/dev") {
		t.Errorf("login printed %q", out)
	}
	path, err := client.ConfigPath()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := client.ReadConfig(path)
	if err != nil || cfg.Token != "" || cfg.Client != "dev" {
		t.Fatalf("client config after login: %+v (%v), want client dev and no token", cfg, err)
	}
	if r := torpor(t, url, "actor", "list"); r.code != 0 || r.stderr != "No actors found.\n" {
		t.Errorf("the client's space: exit %d, stderr %q", r.code, r.stderr)
	}
	// Its own spaces only.
	if out := ok(t, url, "space", "list"); len(strings.Split(strings.TrimSpace(out), "\n")) != 2 || !strings.HasPrefix(strings.Split(out, "\n")[1], "default ") {
		t.Errorf("space list as a user client of default:\n%s", out)
	}
	for _, args := range [][]string{{"actor", "list", "--space", "other"}, {"token", "list"}} {
		if msg := fails(t, url, args...); !strings.HasPrefix(msg, "Error: permission_denied: ") {
			t.Errorf("%v as a user client: %q", args, msg)
		}
	}

	clients := ok(t, url, "--token", admin, "client", "list")
	if lines := strings.Split(strings.TrimSpace(clients), "\n"); len(lines) != 2 || !strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "dev user default ") {
		t.Errorf("client list:\n%s", clients)
	}

	conn, err := client.Discover(client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	saved := func() *x509.Certificate {
		t.Helper()
		creds, err := (&identity.Member{Kind: identity.MemberClient, Name: conn.Client, File: conn.Credentials}).LoadCredentials()
		if err != nil {
			t.Fatal(err)
		}
		return creds.Keypair().Certificate().Leaf
	}
	// Certificates are backdated a minute for clock skew, so with a
	// lifetime of seconds two thirds of it have always passed: every
	// command renews.
	first := saved()
	ok(t, url, "actor", "list")
	if renewed := saved(); renewed.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Errorf("certificate past two thirds of its life not renewed (serial %x)", first.SerialNumber)
	}

	a, err := srv.Authority(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteClient(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	if msg := fails(t, url, "actor", "list"); !strings.HasPrefix(msg, "Error: unauthenticated: ") {
		t.Errorf("deleted client: %q", msg)
	}
}
