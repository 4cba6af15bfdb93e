package server

import (
	"context"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/validate"
)

// e2bKey makes an E2B key for space through the admin.
func (r *replica) e2bKey(tb testing.TB, space string) string {
	tb.Helper()
	resp, err := torporv1connect.NewIdentityServiceClient(r.admin(tb), r.url).CreateToken(context.Background(), connect.NewRequest(&torporv1.CreateTokenRequest{
		Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_E2B, Spaces: []string{space},
	}))
	if err != nil {
		tb.Fatalf("create E2B key for %s: %v", space, err)
	}
	return resp.Msg.GetToken()
}

func (r *replica) sandboxes(hc *http.Client) torporv1connect.SandboxServiceClient {
	return torporv1connect.NewSandboxServiceClient(hc, r.url)
}

// sandboxReplica serves spaces a and b, each with template counter, and
// returns a sandbox client holding an E2B key of a, and one of b.
func sandboxReplica(t *testing.T) (r *replica, ofA, ofB torporv1connect.SandboxServiceClient) {
	t.Helper()
	ctx := context.Background()
	r = startReplica(t, storetest.URL(t, "sqlite"), io.Discard)
	admin := r.clients(r.admin(t))
	for _, space := range []string{"a", "b"} {
		if _, err := admin.spaces.CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: space}}})); err != nil {
			t.Fatal(err)
		}
		tmpl := counterTemplate("counter")
		tmpl.Metadata.Space = space
		if _, err := admin.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tmpl})); err != nil {
			t.Fatal(err)
		}
	}
	return r, r.sandboxes(testClient(t, r.roots, nil, r.e2bKey(t, "a"))), r.sandboxes(testClient(t, r.roots, nil, r.e2bKey(t, "b")))
}

// putSandbox stores a sandbox record as the workflow would leave it.
func putSandbox(t *testing.T, r *replica, space, id string, state torporv1.ActorState, lease time.Duration, labels map[string]string) *torporv1.Actor {
	t.Helper()
	a, err := r.store.Actors().Create(context.Background(), &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: space, Name: id, Labels: labels},
		Spec: &torporv1.ActorSpec{Template: "counter", TemplateRevision: 1, Sandbox: &torporv1.Sandbox{
			EndTime: timestamppb.New(time.Now().Add(lease)), TimeoutSeconds: 300, StartTime: timestamppb.Now(),
		}},
		Status: &torporv1.ActorStatus{State: state},
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// leaseWithin fails unless a's lease ends within a second of want.
func leaseWithin(t *testing.T, a *torporv1.Actor, want time.Time) {
	t.Helper()
	if got := a.GetSpec().GetSandbox().GetEndTime().AsTime(); got.Sub(want).Abs() > time.Second {
		t.Fatalf("lease ends %s, want about %s", got, want)
	}
}

// TestCreateSandboxChecksRequest: bad input is refused naming the field,
// an unknown template is NotFound, and nothing is created.
func TestCreateSandboxChecksRequest(t *testing.T) {
	ctx := context.Background()
	r, ofA, _ := sandboxReplica(t)
	for _, tc := range []struct {
		name  string
		req   *torporv1.CreateSandboxRequest
		code  connect.Code
		field string
	}{
		{"no template", &torporv1.CreateSandboxRequest{Space: "a"}, connect.CodeInvalidArgument, "template: "},
		{"unknown template", &torporv1.CreateSandboxRequest{Space: "a", Template: "nosuch"}, connect.CodeNotFound, "template: "},
		{"bad label", &torporv1.CreateSandboxRequest{Space: "a", Template: "counter", Labels: map[string]string{"no spaces": "x"}}, connect.CodeInvalidArgument, "labels["},
		{"bad env", &torporv1.CreateSandboxRequest{Space: "a", Template: "counter", Env: map[string]string{"A=B": "x"}}, connect.CodeInvalidArgument, "env["},
		{"negative timeout", &torporv1.CreateSandboxRequest{Space: "a", Template: "counter", TimeoutSeconds: -1}, connect.CodeInvalidArgument, "timeoutSeconds: "},
		{"timeout over a day", &torporv1.CreateSandboxRequest{Space: "a", Template: "counter", TimeoutSeconds: MaxSandboxTimeoutSeconds + 1}, connect.CodeInvalidArgument, "timeoutSeconds: "},
		{"another space", &torporv1.CreateSandboxRequest{Space: "b", Template: "counter"}, connect.CodePermissionDenied, "space"},
		{"egress beyond the space's bounds", &torporv1.CreateSandboxRequest{Space: "a", Template: "counter", Egress: &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_ALLOW}}, connect.CodeInvalidArgument, "egress.mode: allow is outside space a's egress bounds"},
		{"egress wider than the template's", &torporv1.CreateSandboxRequest{Space: "a", Template: "counter", Egress: &torporv1.EgressPolicy{Rules: []*torporv1.EgressRule{{Host: "api.example.com"}}}}, connect.CodeInvalidArgument, "spec.egress.mode: allowlist is wider than the template's policy, deny"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ofA.CreateSandbox(ctx, connect.NewRequest(tc.req))
			wantCode(t, err, tc.code, tc.field)
		})
	}
	// No worker to start on: the create fails and leaves no sandbox.
	_, err := ofA.CreateSandbox(ctx, connect.NewRequest(&torporv1.CreateSandboxRequest{Space: "a", Template: "counter", Secure: true}))
	wantCode(t, err, connect.CodeResourceExhausted, "start sandbox")
	actors, _, err := r.store.Actors().List(ctx, store.ListOptions{})
	if err != nil || len(actors) != 0 {
		t.Fatalf("after failed creates: actors %v, %v; want none", actors, err)
	}
}

// TestNewSandboxID: IDs are 20 lower-case letters and digits, valid
// sandbox IDs and actor names, and do not repeat.
func TestNewSandboxID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := newSandboxID()
		if len(id) != sandboxIDLen || validate.SandboxID("id", id) != nil || validate.Name("name", id) != nil || seen[id] {
			t.Fatalf("sandbox ID %q: not 20 valid characters, or a repeat", id)
		}
		seen[id] = true
	}
}

// TestSandboxLeaseCalls: connect extends a lease and never shortens it,
// answering resumed only when it resumed; setTimeout sets it either way;
// an unknown ID, an ordinary actor and another space's sandbox are
// NotFound, and another space's key is refused.
func TestSandboxLeaseCalls(t *testing.T) {
	ctx := context.Background()
	r, ofA, ofB := sandboxReplica(t)
	putSandbox(t, r, "a", "runs1", torporv1.ActorState_ACTOR_STATE_RUNNING, time.Hour, nil)
	putSandbox(t, r, "a", "paused1", torporv1.ActorState_ACTOR_STATE_SUSPENDED, -time.Minute, nil)
	putSandbox(t, r, "b", "other1", torporv1.ActorState_ACTOR_STATE_RUNNING, time.Hour, nil)
	if _, err := r.store.Actors().Create(ctx, &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "a", Name: "plain1"},
		Spec:     &torporv1.ActorSpec{Template: "counter", TemplateRevision: 1},
		Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_RUNNING},
	}); err != nil {
		t.Fatal(err)
	}
	connectTo := func(c torporv1connect.SandboxServiceClient, space, id string, timeout int32) (*torporv1.ConnectSandboxResponse, error) {
		resp, err := c.ConnectSandbox(ctx, connect.NewRequest(&torporv1.ConnectSandboxRequest{Space: space, SandboxId: id, TimeoutSeconds: timeout}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}

	got, err := connectTo(ofA, "a", "runs1", 10)
	if err != nil || got.GetResumed() {
		t.Fatalf("connect to a running sandbox: %v, %v; want it not resumed", got, err)
	}
	leaseWithin(t, got.GetActor(), time.Now().Add(time.Hour))
	if got, err = connectTo(ofA, "a", "runs1", 7200); err != nil {
		t.Fatal(err)
	}
	leaseWithin(t, got.GetActor(), time.Now().Add(2*time.Hour))
	set, err := ofA.SetSandboxTimeout(ctx, connect.NewRequest(&torporv1.SetSandboxTimeoutRequest{Space: "a", SandboxId: "runs1", TimeoutSeconds: 60}))
	if err != nil {
		t.Fatal(err)
	}
	leaseWithin(t, set.Msg, time.Now().Add(time.Minute))

	// A paused sandbox's lease moves before its resume, which finds no
	// worker here.
	_, err = connectTo(ofA, "a", "paused1", 0)
	wantCode(t, err, connect.CodeResourceExhausted, "resume sandbox paused1")
	paused, err := r.store.Actors().Get(ctx, "a", "paused1")
	if err != nil {
		t.Fatal(err)
	}
	leaseWithin(t, paused, time.Now().Add(300*time.Second))

	for _, tc := range []struct {
		name      string
		c         torporv1connect.SandboxServiceClient
		space, id string
		timeout   int32
		code      connect.Code
		msg       string
	}{
		{"unknown", ofA, "a", "nosuch", 0, connect.CodeNotFound, "nosuch"},
		{"an ordinary actor", ofA, "a", "plain1", 0, connect.CodeNotFound, "plain1"},
		{"another space's sandbox", ofA, "a", "other1", 0, connect.CodeNotFound, "other1"},
		{"another space's key", ofB, "a", "runs1", 0, connect.CodePermissionDenied, `space "a"`},
		{"not a sandbox ID", ofA, "a", "Runs-1", 0, connect.CodeInvalidArgument, "sandboxId: "},
		{"timeout over a day", ofA, "a", "runs1", MaxSandboxTimeoutSeconds + 1, connect.CodeInvalidArgument, "timeoutSeconds: "},
		{"negative timeout", ofA, "a", "runs1", -5, connect.CodeInvalidArgument, "timeoutSeconds: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := connectTo(tc.c, tc.space, tc.id, tc.timeout)
			wantCode(t, err, tc.code, tc.msg)
			_, err = tc.c.SetSandboxTimeout(ctx, connect.NewRequest(&torporv1.SetSandboxTimeoutRequest{Space: tc.space, SandboxId: tc.id, TimeoutSeconds: tc.timeout}))
			wantCode(t, err, tc.code, tc.msg)
		})
	}
	if a, err := r.store.Actors().Get(ctx, "b", "other1"); err != nil || a.GetMetadata().GetVersion() != 1 {
		t.Fatalf("another space's sandbox: %v, %v; want it untouched", a, err)
	}
}

// TestListSandboxes: a space's sandboxes only, by ID, filtered by labels
// (all of them) and states, in pages; one being deleted only when its
// state is asked for.
func TestListSandboxes(t *testing.T) {
	ctx := context.Background()
	r, ofA, ofB := sandboxReplica(t)
	running, suspended := torporv1.ActorState_ACTOR_STATE_RUNNING, torporv1.ActorState_ACTOR_STATE_SUSPENDED
	putSandbox(t, r, "a", "s1", running, time.Hour, map[string]string{"team": "x", "env": "dev"})
	putSandbox(t, r, "a", "s2", suspended, time.Hour, map[string]string{"team": "x"})
	putSandbox(t, r, "a", "s3", running, time.Hour, map[string]string{"team": "y"})
	putSandbox(t, r, "a", "s4", running, time.Hour, nil)
	putSandbox(t, r, "a", "s9", torporv1.ActorState_ACTOR_STATE_DELETING, time.Hour, nil)
	putSandbox(t, r, "b", "s5", running, time.Hour, map[string]string{"team": "x"})
	if _, err := r.store.Actors().Create(ctx, &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "a", Name: "plain", Labels: map[string]string{"team": "x"}},
		Spec:     &torporv1.ActorSpec{Template: "counter", TemplateRevision: 1},
		Status:   &torporv1.ActorStatus{State: running},
	}); err != nil {
		t.Fatal(err)
	}
	list := func(req *torporv1.ListSandboxesRequest) ([]string, error) {
		var ids []string
		for pages := 0; pages < 10; pages++ {
			resp, err := ofA.ListSandboxes(ctx, connect.NewRequest(req))
			if err != nil {
				return nil, err
			}
			for _, a := range resp.Msg.GetActors() {
				ids = append(ids, a.GetMetadata().GetName())
			}
			if req.PageToken = resp.Msg.GetNextPageToken(); req.PageToken == "" {
				return ids, nil
			}
		}
		t.Fatal("paging does not end")
		return nil, nil
	}
	for _, tc := range []struct {
		name string
		req  *torporv1.ListSandboxesRequest
		want []string
	}{
		{"all", &torporv1.ListSandboxesRequest{Space: "a"}, []string{"s1", "s2", "s3", "s4"}},
		{"in pages of one", &torporv1.ListSandboxesRequest{Space: "a", PageSize: 1}, []string{"s1", "s2", "s3", "s4"}},
		{"a label", &torporv1.ListSandboxesRequest{Space: "a", Labels: map[string]string{"team": "x"}}, []string{"s1", "s2"}},
		{"two labels", &torporv1.ListSandboxesRequest{Space: "a", Labels: map[string]string{"team": "x", "env": "dev"}}, []string{"s1"}},
		{"a state", &torporv1.ListSandboxesRequest{Space: "a", States: []torporv1.ActorState{suspended}}, []string{"s2"}},
		{"two states, in pages of two", &torporv1.ListSandboxesRequest{Space: "a", PageSize: 2, States: []torporv1.ActorState{suspended, running}}, []string{"s1", "s2", "s3", "s4"}},
		{"a label and a state", &torporv1.ListSandboxesRequest{Space: "a", Labels: map[string]string{"team": "x"}, States: []torporv1.ActorState{running}}, []string{"s1"}},
		{"none match", &torporv1.ListSandboxesRequest{Space: "a", Labels: map[string]string{"team": "z"}}, nil},
		{"one being killed, when asked for", &torporv1.ListSandboxesRequest{Space: "a", States: []torporv1.ActorState{torporv1.ActorState_ACTOR_STATE_DELETING}}, []string{"s9"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := list(tc.req)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("listed %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	_, err := ofA.ListSandboxes(ctx, connect.NewRequest(&torporv1.ListSandboxesRequest{Space: "a", PageToken: "junk!"}))
	wantCode(t, err, connect.CodeInvalidArgument, "pageToken: ")
	_, err = ofA.ListSandboxes(ctx, connect.NewRequest(&torporv1.ListSandboxesRequest{Space: "a", States: []torporv1.ActorState{0}}))
	wantCode(t, err, connect.CodeInvalidArgument, "states[0]: ")
	_, err = ofB.ListSandboxes(ctx, connect.NewRequest(&torporv1.ListSandboxesRequest{Space: "a"}))
	wantCode(t, err, connect.CodePermissionDenied, `space "a"`)
}
