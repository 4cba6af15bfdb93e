package server

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// A router resolves a sandbox ID to its space and actor, only for actors
// made as E2B sandboxes and only in the spaces it serves; nobody but a
// router (or the admin) may ask.
func TestLookupSandbox(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, storetest.URL(t, "sqlite"), io.Discard)
	admin := r.clients(r.admin(t))
	for _, space := range []string{"a", "b"} {
		if _, err := admin.spaces.CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: space}}})); err != nil {
			t.Fatal(err)
		}
	}
	sbx, err := r.store.Actors().Create(ctx, &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "a", Name: "sbx1"},
		Spec:     &torporv1.ActorSpec{Template: "base", TemplateRevision: 1, Sandbox: &torporv1.Sandbox{AutoPause: true, AutoResume: true}},
		Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_PAUSED},
	})
	if err != nil {
		t.Fatal(err)
	}
	// An ordinary actor named like a sandbox is no sandbox.
	if _, err := r.store.Actors().Create(ctx, &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "b", Name: "plain1"},
		Spec:     &torporv1.ActorSpec{Template: "base", TemplateRevision: 1},
		Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_RUNNING},
	}); err != nil {
		t.Fatal(err)
	}
	lookup := func(hc *http.Client, id string) (*torporv1.LookupSandboxResponse, error) {
		resp, err := torporv1connect.NewPlacementServiceClient(hc, r.url).LookupSandbox(ctx, connect.NewRequest(&torporv1.LookupSandboxRequest{SandboxId: id}))
		if err != nil {
			return nil, err
		}
		return resp.Msg, nil
	}
	router := r.httpClient(t, joinClient(t, r, "router", torporv1.ClientRole_CLIENT_ROLE_ROUTER))
	routerOfB := r.httpClient(t, joinClient(t, r, "router-b", torporv1.ClientRole_CLIENT_ROLE_ROUTER, "b"))
	userOfA := r.httpClient(t, joinClient(t, r, "user-a", torporv1.ClientRole_CLIENT_ROLE_USER, "a"))
	for _, tc := range []struct {
		name   string
		caller *http.Client
		id     string
		code   connect.Code
	}{
		{"router finds it", router, "sbx1", 0},
		{"admin finds it", r.admin(t), "sbx1", 0},
		{"router of another space", routerOfB, "sbx1", connect.CodeNotFound},
		{"an ordinary actor", router, "plain1", connect.CodeNotFound},
		{"no such sandbox", router, "nosuch", connect.CodeNotFound},
		{"not a sandbox ID", router, "Bad-ID", connect.CodeInvalidArgument},
		{"a user of its space", userOfA, "sbx1", connect.CodePermissionDenied},
		{"anonymous", r.httpClient(t, nil), "sbx1", connect.CodeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := lookup(tc.caller, tc.id)
			if connect.CodeOf(err) != tc.code && !(tc.code == 0 && err == nil) {
				t.Fatalf("%v, want code %v", err, tc.code)
			}
			if tc.code != 0 {
				return
			}
			if got.GetSpace() != "a" || got.GetName() != "sbx1" || got.GetActorUid() != sbx.GetMetadata().GetUid() ||
				got.GetState() != torporv1.ActorState_ACTOR_STATE_PAUSED || !got.GetSandbox().GetAutoResume() {
				t.Fatalf("lookup answered %v", got)
			}
		})
	}
}

// TestCreateActorRefusesSandboxSettings: the spec fields of E2B sandboxes
// are refused by CreateActor naming the field, not dropped, and nothing is
// created.
func TestCreateActorRefusesSandboxSettings(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, "sqlite:"+filepath.Join(t.TempDir(), "t.db"), io.Discard)
	c := r.clients(r.admin(t))
	for _, tc := range []struct {
		field string
		spec  *torporv1.ActorSpec
	}{
		{"actor.spec.env", &torporv1.ActorSpec{Template: "counter", Env: map[string]string{"A": "b"}}},
		{"actor.spec.envdAccessToken", &torporv1.ActorSpec{Template: "counter", EnvdAccessToken: "t"}},
		{"actor.spec.sandbox", &torporv1.ActorSpec{Template: "counter", Sandbox: &torporv1.Sandbox{AutoPause: true}}},
	} {
		t.Run(tc.field, func(t *testing.T) {
			_, err := c.actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
				Metadata: &torporv1.ObjectMeta{Space: "default", Name: "a1"}, Spec: tc.spec,
			}}))
			wantCode(t, err, connect.CodeInvalidArgument, tc.field+": ")
			if _, err := c.actors.GetActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "a1"})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("after the refusal: %v, want no actor a1", err)
			}
		})
	}
}
