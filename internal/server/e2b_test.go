package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
)

// e2bCall makes an E2B REST call with key (empty: none) and returns the
// status and the {code, message} of an error answer.
func e2bCall(t *testing.T, hc *http.Client, method, url, key string) (int, string) {
	t.Helper()
	var reqBody io.Reader
	if method == "POST" {
		reqBody = strings.NewReader("{}")
	}
	req, err := http.NewRequest(method, url, reqBody)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(body, &e); err != nil || e.Code != resp.StatusCode {
			t.Fatalf("%s %s: %d with body %s, want {code: %d, message}", method, url, resp.StatusCode, body, resp.StatusCode)
		}
	}
	return resp.StatusCode, e.Message
}

// TestE2BOnTheAPIPort: the E2B paths of the API port reach the connect
// handlers in process, through the gate, with the caller's key.
func TestE2BOnTheAPIPort(t *testing.T) {
	r := startReplica(t, "sqlite:"+filepath.Join(t.TempDir(), "db"), io.Discard)
	ctx := context.Background()
	if _, err := torporv1connect.NewSpaceServiceClient(r.admin(t), r.url).CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{
		Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: "team"}},
	})); err != nil {
		t.Fatal(err)
	}
	made, err := torporv1connect.NewIdentityServiceClient(r.admin(t), r.url).CreateToken(ctx, connect.NewRequest(&torporv1.CreateTokenRequest{
		Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_E2B, Spaces: []string{"team"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	key := made.Msg.GetToken()
	hc := testClient(t, r.roots, nil, "")
	for _, c := range []struct {
		name, method, path, key string
		status                  int
		message                 string
	}{
		{"no key", "GET", "/sandboxes/abc", "", 401, "X-API-KEY"},
		{"a key the gate refuses", "GET", "/sandboxes/abc", "e2b_00ff", 401, "invalid or expired"},
		{"a sandbox the space does not have", "GET", "/sandboxes/abc", key, 404, "not found"},
		{"kill one", "DELETE", "/sandboxes/abc", key, 404, "sandbox abc not found"},
		{"pause one", "POST", "/sandboxes/abc/pause", key, 404, "sandbox abc not found"},
		{"connect one", "POST", "/v2/sandboxes/abc/connect", key, 404, "sandbox abc not found"},
		{"its metrics", "GET", "/sandboxes/abc/metrics", key, 404, "sandbox abc not found"},
		{"list the space's", "GET", "/v2/sandboxes?state=running,paused&metadata=a%3Db", key, 200, ""},
		{"create without a template", "POST", "/v2/sandboxes", key, 400, "templateID"},
		{"the admin token is of every space, not one", "GET", "/sandboxes/abc", r.adminToken, 403, "exactly one"},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, msg := e2bCall(t, hc, c.method, r.url+c.path, c.key)
			if status != c.status || !strings.Contains(msg, c.message) {
				t.Errorf("%s %s: %d %q, want %d with %q", c.method, c.path, status, msg, c.status, c.message)
			}
		})
	}
}

// TestE2BListener: Start serves the E2B API alone on a plain-HTTP
// listener of its own.
func TestE2BListener(t *testing.T) {
	dir := t.TempDir()
	cp, err := Start(context.Background(), Options{
		Listen: "127.0.0.1:0", E2BListen: "127.0.0.1:0", E2BDomain: "sandboxes.example:8443",
		Store: "sqlite:" + filepath.Join(dir, "torpor.db"), Snapshots: filepath.Join(dir, "snapshots"),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Stop() })
	if !strings.HasPrefix(cp.E2BURL, "http://127.0.0.1:") {
		t.Fatalf("E2BURL %q, want a plain-HTTP loopback URL", cp.E2BURL)
	}
	if status, _ := e2bCall(t, http.DefaultClient, "GET", cp.E2BURL+"/sandboxes/abc", ""); status != 401 {
		t.Errorf("no key: %d, want 401", status)
	}
	if status, msg := e2bCall(t, http.DefaultClient, "GET", cp.E2BURL+"/sandboxes/abc", cp.AdminToken); status != 404 {
		// One space (default) exists: the admin token sees only it.
		t.Errorf("the admin token: %d %q, want 404", status, msg)
	}
	// The connect API is not served there.
	resp, err := http.Post(cp.E2BURL+"/"+torporv1connect.SpaceServiceName+"/ListSpaces", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the connect API on the E2B listener: %d, want 404", resp.StatusCode)
	}
}
