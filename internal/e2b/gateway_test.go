package e2b

import (
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

var testNow = time.Date(2026, 12, 2, 15, 1, 30, 0, time.UTC)

// apiCase is one E2B call and what it must answer.
type apiCase struct {
	name   string
	method string
	path   string
	// key is the X-API-KEY; "" is keyA, "-" none.
	key   string
	body  string
	setup func(f *fakeAPI)
	// status and, when set, fields of the JSON body (top level) or, for
	// an error, a part of its message.
	status  int
	fields  map[string]any
	message string
	header  map[string]string
	// check looks at the calls the fake received.
	check func(t *testing.T, f *fakeAPI, body []byte)
}

func (c apiCase) run(t *testing.T) {
	t.Helper()
	f := newFakeAPI()
	f.put(sandboxActor(spaceA, "run1", torporv1.ActorState_ACTOR_STATE_RUNNING, map[string]string{"app": "x"}))
	f.put(sandboxActor(spaceA, "pau1", torporv1.ActorState_ACTOR_STATE_SUSPENDED, map[string]string{"app": "y"}))
	f.put(sandboxActor(spaceB, "other1", torporv1.ActorState_ACTOR_STATE_RUNNING, nil))
	plain := sandboxActor(spaceA, "plain", torporv1.ActorState_ACTOR_STATE_RUNNING, nil)
	plain.Spec.Sandbox = nil
	f.put(plain)
	if c.setup != nil {
		c.setup(f)
	}
	h := f.serve(t, testNow).Handler()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req := httptest.NewRequest(c.method, c.path, body)
	switch c.key {
	case "":
		req.Header.Set("X-API-KEY", keyA)
	case "-":
	default:
		req.Header.Set("X-API-KEY", c.key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	got := rec.Body.Bytes()
	if rec.Code != c.status {
		t.Fatalf("%s %s: status %d, want %d; body %s", c.method, c.path, rec.Code, c.status, got)
	}
	for k, v := range c.header {
		if h := rec.Header().Get(k); h != v {
			t.Errorf("header %s = %q, want %q", k, h, v)
		}
	}
	if rec.Code >= 400 {
		var e errorBody
		if err := json.Unmarshal(got, &e); err != nil {
			t.Fatalf("error body %s: %v", got, err)
		}
		if e.Code != c.status {
			t.Errorf("error body code %d, want %d", e.Code, c.status)
		}
		if !strings.Contains(e.Message, c.message) {
			t.Errorf("error message %q, want it to contain %q", e.Message, c.message)
		}
	}
	if c.fields != nil {
		var obj map[string]any
		if err := json.Unmarshal(got, &obj); err != nil {
			t.Fatalf("body %s: %v", got, err)
		}
		for k, want := range c.fields {
			if !reflect.DeepEqual(obj[k], want) {
				t.Errorf("body %s = %#v, want %#v (body %s)", k, obj[k], want, got)
			}
		}
	}
	if c.check != nil {
		c.check(t, f, got)
	}
}

func lastCall[T proto.Message](t *testing.T, f *fakeAPI, procedure string) T {
	t.Helper()
	calls := f.calledWith(procedure)
	if len(calls) == 0 {
		t.Fatalf("%s was not called", procedure)
	}
	return calls[len(calls)-1].(T)
}

func notCalled(procedures ...string) func(t *testing.T, f *fakeAPI, _ []byte) {
	return func(t *testing.T, f *fakeAPI, _ []byte) {
		t.Helper()
		for _, p := range procedures {
			if n := len(f.calledWith(p)); n > 0 {
				t.Errorf("%s called %d times, want none", p, n)
			}
		}
	}
}

func TestCreate(t *testing.T) {
	for _, c := range []apiCase{
		{
			name: "v2 with everything the SDK sends", method: "POST", path: "/v2/sandboxes",
			body:   `{"templateID":"base","timeout":60,"metadata":{"app":"x"},"envVars":{"A":"1"},"autoPause":true,"autoResume":{"enabled":true}}`,
			status: 201,
			fields: map[string]any{"sandboxID": "sbx1", "templateID": "base", "envdVersion": EnvdVersion, "envdAccessToken": "envd-sbx1", "domain": "actors.localhost:7080", "clientID": "node1"},
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				got := lastCall[*torporv1.CreateSandboxRequest](t, f, "CreateSandbox")
				want := &torporv1.CreateSandboxRequest{Space: spaceA, Template: "base", Labels: map[string]string{"app": "x"}, Env: map[string]string{"A": "1"}, TimeoutSeconds: 60, AutoPause: true, AutoResume: true, Secure: true}
				if !proto.Equal(got, want) {
					t.Errorf("CreateSandbox got %v, want %v", got, want)
				}
			},
		},
		{
			name: "v2 without a timeout leaves the default to the server, and is secure whatever it says", method: "POST", path: "/v2/sandboxes",
			body: `{"templateID":"base","secure":false}`, status: 201,
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				got := lastCall[*torporv1.CreateSandboxRequest](t, f, "CreateSandbox")
				if got.GetTimeoutSeconds() != 0 || !got.GetSecure() || got.GetAutoPause() || got.GetAutoResume() {
					t.Errorf("CreateSandbox got %v", got)
				}
			},
		},
		{
			name: "v1 as SDK 2.50 sends it", method: "POST", path: "/sandboxes",
			body:   `{"templateID":"base","timeout":300,"secure":true,"allow_internet_access":true}`,
			status: 201, fields: map[string]any{"sandboxID": "sbx1", "envdAccessToken": "envd-sbx1"},
		},
		{
			name: "v1 secure=false makes no access token", method: "POST", path: "/sandboxes",
			body: `{"templateID":"base","secure":false}`, status: 201,
			check: func(t *testing.T, f *fakeAPI, body []byte) {
				if got := lastCall[*torporv1.CreateSandboxRequest](t, f, "CreateSandbox"); got.GetSecure() {
					t.Errorf("CreateSandbox secure, want not: %v", got)
				}
				if strings.Contains(string(body), "envdAccessToken") {
					t.Errorf("body %s has an access token", body)
				}
			},
		},
		{name: "autoResume as a bare boolean", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","autoResume":true}`, status: 201,
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				if !lastCall[*torporv1.CreateSandboxRequest](t, f, "CreateSandbox").GetAutoResume() {
					t.Error("autoResume not passed on")
				}
			}},
		{name: "no template", method: "POST", path: "/v2/sandboxes", body: `{"timeout":10}`, status: 400, message: "templateID: required", check: notCalled("CreateSandbox")},
		{name: "not JSON", method: "POST", path: "/v2/sandboxes", body: `{templateID`, status: 400, message: "body:"},
		{name: "negative timeout", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","timeout":-1}`, status: 400, message: "timeout:"},
		{name: "no internet access is an egress policy of DENY", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","allow_internet_access":false}`, status: 201,
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				if got := lastCall[*torporv1.CreateSandboxRequest](t, f, "CreateSandbox").GetEgress(); got.GetMode() != torporv1.EgressMode_EGRESS_MODE_DENY {
					t.Errorf("allow_internet_access false: egress %v, want DENY", got)
				}
			}},
		{name: "internet access is the template's policy", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","allow_internet_access":true}`, status: 201,
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				if got := lastCall[*torporv1.CreateSandboxRequest](t, f, "CreateSandbox").GetEgress(); got != nil {
					t.Errorf("allow_internet_access true: egress %v, want none (the template's)", got)
				}
			}},
		{name: "mcp", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","mcp":{"x":{}}}`, status: 400, message: "mcp:"},
		{name: "volume mounts", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","volumeMounts":[{"name":"v","path":"/d"}]}`, status: 400, message: "volumeMounts:"},
		{name: "auto-pause without memory", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","autoPause":true,"autoPauseMemory":false}`, status: 400, message: "autoPauseMemory:"},
		{name: "null fields are absent ones", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","network":null,"mcp":null}`, status: 201},
		{
			name: "a template the server does not know", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"nope"}`,
			setup: func(f *fakeAPI) {
				f.fail["CreateSandbox"] = connect.NewError(connect.CodeNotFound, errors.New(`template team-a/nope not found`))
			},
			status: 404, message: "template team-a/nope not found",
		},
		{
			name: "bad metadata names the server's field", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","metadata":{"BAD KEY":"v"}}`,
			setup: func(f *fakeAPI) {
				f.fail["CreateSandbox"] = connect.NewError(connect.CodeInvalidArgument, errors.New(`labels: "BAD KEY" is not a label key`))
			},
			status: 400, message: "labels:",
		},
		{
			name: "no capacity", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base"}`,
			setup: func(f *fakeAPI) {
				f.fail["CreateSandbox"] = connect.NewError(connect.CodeResourceExhausted, errors.New("no free worker"))
			},
			status: 503, message: "no free worker",
		},
	} {
		t.Run(c.name, c.run)
	}
}

func TestKeys(t *testing.T) {
	for _, c := range []apiCase{
		{name: "missing key", method: "GET", path: "/v2/sandboxes", key: "-", status: 401, message: "X-API-KEY", check: notCalled("ListSpaces", "ListSandboxes")},
		{name: "unknown key", method: "GET", path: "/v2/sandboxes", key: "e2b_nope", status: 401, message: "invalid or expired"},
		{name: "missing key on create", method: "POST", path: "/v2/sandboxes", key: "-", body: `{"templateID":"base"}`, status: 401, check: notCalled("CreateSandbox")},
		{name: "a credential of several spaces", method: "GET", path: "/v2/sandboxes", key: "admin", status: 403, message: "exactly one", check: notCalled("ListSandboxes")},
		{name: "a key of no space", method: "GET", path: "/v2/sandboxes", key: "e2b_empty", status: 403, message: "no space"},
		{
			name: "every call presents the key as the bearer token", method: "GET", path: "/sandboxes/run1", status: 200,
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				if got := lastCall[*torporv1.GetRequest](t, f, "GetActor"); got.GetSpace() != spaceA {
					t.Errorf("GetActor space %q, want %q", got.GetSpace(), spaceA)
				}
			},
		},
		{name: "another space's sandbox is not found", method: "GET", path: "/sandboxes/other1", status: 404, message: "not found"},
		{name: "another space's sandbox cannot be killed", method: "DELETE", path: "/sandboxes/other1", status: 404, check: notCalled("DeleteActor")},
		{
			name: "PermissionDenied about a sandbox is 404", method: "POST", path: "/sandboxes/run1/timeout", body: `{"timeout":30}`,
			setup: func(f *fakeAPI) {
				f.fail["SetSandboxTimeout"] = connect.NewError(connect.CodePermissionDenied, errors.New("sandbox run1 is another space's"))
			},
			status: 404, message: "sandbox run1 not found",
		},
		{
			name: "PermissionDenied about no sandbox is 403", method: "GET", path: "/v2/sandboxes",
			setup: func(f *fakeAPI) {
				f.fail["ListSandboxes"] = connect.NewError(connect.CodePermissionDenied, errors.New("an E2B key may not"))
			},
			status: 403, message: "an E2B key may not",
		},
	} {
		t.Run(c.name, c.run)
	}
}

func TestKeySpaceIsRemembered(t *testing.T) {
	f := newFakeAPI()
	f.put(sandboxActor(spaceA, "run1", torporv1.ActorState_ACTOR_STATE_RUNNING, nil))
	h := f.serve(t, testNow).Handler()
	for range 3 {
		req := httptest.NewRequest("GET", "/sandboxes/run1", nil)
		req.Header.Set("X-API-KEY", keyA)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
	if n := len(f.calledWith("ListSpaces")); n != 1 {
		t.Errorf("ListSpaces called %d times for 3 calls of one key, want 1", n)
	}
	// A key the server stops accepting is asked about again.
	delete(f.keys, keyA)
	for range 2 {
		req := httptest.NewRequest("GET", "/sandboxes/run1", nil)
		req.Header.Set("X-API-KEY", keyA)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 401 {
			t.Fatalf("revoked key: status %d, want 401: %s", rec.Code, rec.Body)
		}
	}
	if n := len(f.calledWith("ListSpaces")); n != 2 {
		t.Errorf("ListSpaces called %d times, want 2 (once more after the refusal)", n)
	}
}

func TestGet(t *testing.T) {
	for _, c := range []apiCase{
		{
			name: "running", method: "GET", path: "/sandboxes/run1", status: 200,
			fields: map[string]any{
				"sandboxID": "run1", "templateID": "base", "state": "running", "cpuCount": 2.0, "memoryMB": 512.0, "diskSizeMB": 0.0,
				"startedAt": "2026-12-02T15:00:00Z", "endAt": "2026-12-02T15:05:00Z", "metadata": map[string]any{"app": "x"},
				"envdVersion": EnvdVersion, "envdAccessToken": "envd-run1", "domain": "actors.localhost:7080",
				"lifecycle": map[string]any{"autoResume": false, "onTimeout": "pause"},
			},
		},
		{name: "paused", method: "GET", path: "/sandboxes/pau1", status: 200, fields: map[string]any{"state": "paused"}},
		{name: "missing", method: "GET", path: "/sandboxes/nope", status: 404, message: "not found"},
		{name: "an actor that is no sandbox", method: "GET", path: "/sandboxes/plain", status: 404, message: "sandbox plain not found"},
		{
			name: "a sandbox being killed", method: "GET", path: "/sandboxes/del1",
			setup: func(f *fakeAPI) {
				f.put(sandboxActor(spaceA, "del1", torporv1.ActorState_ACTOR_STATE_DELETING, nil))
			},
			status: 404, message: "sandbox del1 not found",
		},
		{name: "not a sandbox ID", method: "GET", path: "/sandboxes/Not-An-ID", status: 404, message: "sandboxID", check: notCalled("GetActor")},
		{
			name: "server unavailable", method: "GET", path: "/sandboxes/run1",
			setup: func(f *fakeAPI) {
				f.fail["GetActor"] = connect.NewError(connect.CodeUnavailable, errors.New("store down"))
			},
			status: 503, message: "store down",
		},
		{
			name: "server fault", method: "GET", path: "/sandboxes/run1",
			setup:  func(f *fakeAPI) { f.fail["GetActor"] = connect.NewError(connect.CodeInternal, errors.New("boom")) },
			status: 500, message: "boom",
		},
		{name: "E2B calls Torpor does not offer", method: "POST", path: "/sandboxes/run1/snapshots", body: `{}`, status: 501, message: "not offered"},
	} {
		t.Run(c.name, c.run)
	}
}

func TestList(t *testing.T) {
	ids := func(want ...string) func(t *testing.T, f *fakeAPI, body []byte) {
		return func(t *testing.T, _ *fakeAPI, body []byte) {
			t.Helper()
			var items []listedSandbox
			if err := json.Unmarshal(body, &items); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			var got []string
			for _, it := range items {
				got = append(got, it.SandboxID)
			}
			if !slices.Equal(got, want) {
				t.Errorf("listed %v, want %v", got, want)
			}
		}
	}
	many := func(f *fakeAPI) {
		for _, id := range []string{"a1", "a2", "a3"} {
			f.put(sandboxActor(spaceA, id, torporv1.ActorState_ACTOR_STATE_RUNNING, nil))
		}
	}
	for _, c := range []apiCase{
		{name: "all of the key's space, both states", method: "GET", path: "/v2/sandboxes", status: 200, check: ids("pau1", "run1")},
		{
			name: "a sandbox being killed is gone", method: "GET", path: "/v2/sandboxes",
			setup: func(f *fakeAPI) {
				f.put(sandboxActor(spaceA, "del1", torporv1.ActorState_ACTOR_STATE_DELETING, nil))
			},
			status: 200, check: ids("pau1", "run1"),
		},
		{name: "by state, comma-separated as the SDK sends it", method: "GET", path: "/v2/sandboxes?state=paused", status: 200, check: ids("pau1")},
		{name: "both states", method: "GET", path: "/v2/sandboxes?state=running,paused", status: 200, check: ids("pau1", "run1")},
		{name: "repeated state", method: "GET", path: "/v2/sandboxes?state=running&state=paused", status: 200, check: ids("pau1", "run1")},
		{name: "bad state", method: "GET", path: "/v2/sandboxes?state=gone", status: 400, message: "state:"},
		{
			// The SDK encodes each key and value, then the pair list.
			name: "by metadata", method: "GET", path: "/v2/sandboxes?metadata=app%3Dy", status: 200, check: ids("pau1"),
		},
		{
			// {"a b": "c+d"}: "a%20b" and "c%2Bd", "a%2520b=c%252Bd", then
			// that as a query parameter.
			name: "metadata encoded as the SDK encodes it", method: "GET", path: "/v2/sandboxes?metadata=a%252520b%3Dc%25252Bd",
			setup: func(f *fakeAPI) {
				f.put(sandboxActor(spaceA, "sp1", torporv1.ActorState_ACTOR_STATE_RUNNING, map[string]string{"a b": "c+d"}))
			},
			status: 200, check: ids("sp1"),
		},
		{name: "bad metadata", method: "GET", path: "/v2/sandboxes?metadata=a%3Db%3Bc", status: 400, message: "metadata:"},
		{
			name: "metadata encoded once", method: "GET", path: "/v2/sandboxes?metadata=pct%3D50%2525",
			setup: func(f *fakeAPI) {
				f.put(sandboxActor(spaceA, "pc1", torporv1.ActorState_ACTOR_STATE_RUNNING, map[string]string{"pct": "50%"}))
			},
			status: 200, check: ids("pc1"),
		},
		{name: "a key asked two values", method: "GET", path: "/v2/sandboxes?metadata=a%3D1%26a%3D2", status: 400, message: "metadata:"},
		{
			name: "a page and the token of the next", method: "GET", path: "/v2/sandboxes?limit=2", setup: many, status: 200,
			header: map[string]string{"X-Next-Token": "2"}, check: ids("a1", "a2"),
		},
		{
			name: "the last page has no token", method: "GET", path: "/v2/sandboxes?limit=2&nextToken=4", setup: many, status: 200,
			header: map[string]string{"X-Next-Token": ""}, check: ids("run1"),
		},
		{name: "limit out of range", method: "GET", path: "/v2/sandboxes?limit=1000", status: 400, message: "limit:"},
		{name: "order is refused", method: "GET", path: "/v2/sandboxes?order=asc", status: 400, message: "order:"},
		{name: "by template", method: "GET", path: "/v2/sandboxes?template=base", status: 200, check: ids("pau1", "run1")},
		{name: "by another template", method: "GET", path: "/v2/sandboxes?template=other", status: 200, check: ids()},
		{name: "started after", method: "GET", path: "/v2/sandboxes?startedAfter=2026-12-02T14:00:00Z", status: 200, check: ids("pau1", "run1")},
		{name: "started after all", method: "GET", path: "/v2/sandboxes?startedAfter=2026-12-02T16:00:00Z", status: 200, check: ids()},
		{name: "bad start time", method: "GET", path: "/v2/sandboxes?startedAfter=yesterday", status: 400, message: "startedAfter:"},
		{
			name: "the state filter reaches the server", method: "GET", path: "/v2/sandboxes?state=running", status: 200,
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				got := lastCall[*torporv1.ListSandboxesRequest](t, f, "ListSandboxes")
				if !reflect.DeepEqual(got.GetStates(), statesOf[stateRunning]) || got.GetSpace() != spaceA || got.GetPageSize() != maxListLimit {
					t.Errorf("ListSandboxes got %v", got)
				}
			},
		},
		{name: "deprecated list: running only, every page", method: "GET", path: "/sandboxes", setup: many, status: 200, check: ids("a1", "a2", "a3", "run1")},
	} {
		t.Run(c.name, c.run)
	}
}

func TestLifecycle(t *testing.T) {
	for _, c := range []apiCase{
		{
			name: "kill", method: "DELETE", path: "/sandboxes/run1", status: 204,
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				got := lastCall[*torporv1.DeleteRequest](t, f, "DeleteActor")
				if !got.GetForce() || got.GetUid() != "uid-run1" || got.GetSpace() != spaceA {
					t.Errorf("DeleteActor got %v, want force and the sandbox's uid", got)
				}
			},
		},
		{name: "kill a missing sandbox", method: "DELETE", path: "/sandboxes/nope", status: 404},
		{name: "kill an actor that is no sandbox", method: "DELETE", path: "/sandboxes/plain", status: 404, check: notCalled("DeleteActor")},
		{name: "pause", method: "POST", path: "/sandboxes/run1/pause", body: `{}`, status: 204,
			check: func(t *testing.T, f *fakeAPI, _ []byte) { lastCall[*torporv1.GetRequest](t, f, "SuspendActor") }},
		{name: "pause as SDK 2.50 asks it", method: "POST", path: "/sandboxes/run1/pause", body: `{"memory":true}`, status: 204},
		{name: "pause a paused sandbox", method: "POST", path: "/sandboxes/pau1/pause", status: 409, message: "already paused", check: notCalled("SuspendActor")},
		{name: "pause without memory", method: "POST", path: "/sandboxes/run1/pause", body: `{"memory":false}`, status: 400, message: "memory:"},
		{name: "pause a missing sandbox", method: "POST", path: "/sandboxes/nope/pause", status: 404},
		{
			name: "pause a crashed-while-pausing sandbox the server refuses", method: "POST", path: "/sandboxes/run1/pause",
			setup: func(f *fakeAPI) {
				f.fail["SuspendActor"] = connect.NewError(connect.CodeFailedPrecondition, errors.New("actor is CRASHED"))
			},
			status: 409, message: "CRASHED",
		},
		{name: "connect a paused sandbox resumes it: 201", method: "POST", path: "/v2/sandboxes/pau1/connect", body: `{"timeout":120}`, status: 201,
			fields: map[string]any{"sandboxID": "pau1", "envdAccessToken": "envd-pau1", "domain": "actors.localhost:7080", "envdVersion": EnvdVersion},
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				got := lastCall[*torporv1.ConnectSandboxRequest](t, f, "ConnectSandbox")
				if got.GetTimeoutSeconds() != 120 || got.GetSandboxId() != "pau1" || got.GetSpace() != spaceA {
					t.Errorf("ConnectSandbox got %v", got)
				}
			}},
		{name: "connect a running sandbox: 200", method: "POST", path: "/v2/sandboxes/run1/connect", body: `{}`, status: 200, fields: map[string]any{"sandboxID": "run1"}},
		{name: "connect without a body (v2's is optional)", method: "POST", path: "/v2/sandboxes/run1/connect", status: 200,
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				if got := lastCall[*torporv1.ConnectSandboxRequest](t, f, "ConnectSandbox"); got.GetTimeoutSeconds() != 0 {
					t.Errorf("ConnectSandbox timeout %d, want 0 (the sandbox's own)", got.GetTimeoutSeconds())
				}
			}},
		{name: "connect as SDK 2.50 calls it", method: "POST", path: "/sandboxes/pau1/connect", body: `{"timeout":300}`, status: 201},
		{name: "connect a missing sandbox", method: "POST", path: "/v2/sandboxes/nope/connect", body: `{}`, status: 404},
		{name: "connect without memory", method: "POST", path: "/v2/sandboxes/pau1/connect", body: `{"memory":false}`, status: 400, message: "memory:"},
		{name: "resume a paused sandbox", method: "POST", path: "/sandboxes/pau1/resume", body: `{"timeout":60}`, status: 201, fields: map[string]any{"sandboxID": "pau1"}},
		{name: "resume a running sandbox", method: "POST", path: "/sandboxes/run1/resume", status: 409, message: "already running", check: notCalled("ConnectSandbox")},
		{name: "resume with autoPause", method: "POST", path: "/sandboxes/pau1/resume", body: `{"autoPause":true}`, status: 400, message: "autoPause:"},
		{name: "set timeout", method: "POST", path: "/sandboxes/run1/timeout", body: `{"timeout":30}`, status: 204,
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				got := lastCall[*torporv1.SetSandboxTimeoutRequest](t, f, "SetSandboxTimeout")
				if got.GetTimeoutSeconds() != 30 || got.GetSandboxId() != "run1" || got.GetSpace() != spaceA {
					t.Errorf("SetSandboxTimeout got %v", got)
				}
			}},
		{name: "set timeout without one", method: "POST", path: "/sandboxes/run1/timeout", body: `{}`, status: 400, message: "timeout: required"},
		{name: "set a missing sandbox's timeout", method: "POST", path: "/sandboxes/nope/timeout", body: `{"timeout":30}`, status: 404},
		{name: "refresh", method: "POST", path: "/sandboxes/run1/refreshes", body: `{"duration":60}`, status: 204,
			check: func(t *testing.T, f *fakeAPI, _ []byte) {
				if got := lastCall[*torporv1.ConnectSandboxRequest](t, f, "ConnectSandbox"); got.GetTimeoutSeconds() != 60 {
					t.Errorf("ConnectSandbox got %v", got)
				}
			}},
		{name: "refresh a paused sandbox", method: "POST", path: "/sandboxes/pau1/refreshes", body: `{"duration":60}`, status: 404, check: notCalled("ConnectSandbox")},
		{name: "refresh too long", method: "POST", path: "/sandboxes/run1/refreshes", body: `{"duration":7200}`, status: 400, message: "duration:"},
	} {
		t.Run(c.name, c.run)
	}
}

func TestMetrics(t *testing.T) {
	sample := func(want sandboxMetric) func(t *testing.T, f *fakeAPI, body []byte) {
		return func(t *testing.T, _ *fakeAPI, body []byte) {
			t.Helper()
			var got []sandboxMetric
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			if len(got) != 1 || got[0] != want {
				t.Errorf("metrics %+v, want [%+v]", got, want)
			}
		}
	}
	empty := func(t *testing.T, _ *fakeAPI, body []byte) {
		if strings.TrimSpace(string(body)) != "[]" {
			t.Errorf("metrics %s, want []", body)
		}
	}
	for _, c := range []apiCase{
		{
			// 90 CPU seconds in the 90 s since the start, on 2 CPUs.
			name: "a running sandbox", method: "GET", path: "/sandboxes/run1/metrics", status: 200,
			check: sample(sandboxMetric{
				Timestamp: "2026-12-02T15:01:30Z", TimestampUnix: testNow.Unix(), CPUCount: 2, CPUUsedPct: 50,
				MemUsed: 100 << 20, MemTotal: 512 << 20,
			}),
		},
		{name: "a paused sandbox has none", method: "GET", path: "/sandboxes/pau1/metrics", status: 200, check: empty},
		{name: "a window that has passed", method: "GET", path: "/sandboxes/run1/metrics?start=1000&end=2000", status: 200, check: empty},
		{name: "a bad window", method: "GET", path: "/sandboxes/run1/metrics?start=yesterday", status: 400, message: "start:"},
		{name: "a missing sandbox", method: "GET", path: "/sandboxes/nope/metrics", status: 404},
	} {
		t.Run(c.name, c.run)
	}
}

func TestStatusOf(t *testing.T) {
	for _, c := range []struct {
		code      connect.Code
		sandboxID string
		want      int
	}{
		{connect.CodeNotFound, "x", 404},
		{connect.CodePermissionDenied, "x", 404},
		{connect.CodePermissionDenied, "", 403},
		{connect.CodeUnauthenticated, "", 401},
		{connect.CodeInvalidArgument, "", 400},
		{connect.CodeFailedPrecondition, "x", 409},
		{connect.CodeAlreadyExists, "", 409},
		{connect.CodeAborted, "x", 409},
		{connect.CodeResourceExhausted, "", 503},
		{connect.CodeUnavailable, "", 503},
		{connect.CodeDeadlineExceeded, "", 504},
		{connect.CodeUnimplemented, "", 501},
		{connect.CodeInternal, "", 500},
		{connect.CodeUnknown, "", 500},
		{connect.CodeDataLoss, "", 500},
	} {
		if got := statusOf(connect.NewError(c.code, errors.New("m")), c.sandboxID).status; got != c.want {
			t.Errorf("%v (sandbox %q): %d, want %d", c.code, c.sandboxID, got, c.want)
		}
	}
}

// TestInProcess serves the gateway's calls with a handler in this process.
func TestInProcess(t *testing.T) {
	f := newFakeAPI()
	f.put(sandboxActor(spaceA, "run1", torporv1.ActorState_ACTOR_STATE_RUNNING, nil))
	g := New(Config{APIURL: InProcessURL, HTTPClient: InProcess(f.handler()), Domain: "d"})
	req := httptest.NewRequest("GET", "/sandboxes/run1", nil)
	req.Header.Set("X-API-KEY", keyA)
	rec := httptest.NewRecorder()
	g.Handler().ServeHTTP(rec, req)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"sandboxID":"run1"`) {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
}
