package server

import (
	"context"
	"io"
	"strings"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// TestFileCallsAreAuthorizedPerSpace: every file call, streams included
// (checked on their first message), refuses a token of another space, and
// a path climbing out with ".." is refused before the actor is resumed
// (it stays SUSPENDED; no node is needed to tell).
func TestFileCallsAreAuthorizedPerSpace(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, storetest.URL(t, "sqlite"), io.Discard)
	admin := r.clients(r.admin(t))
	for _, space := range []string{"a", "b"} {
		if _, err := admin.spaces.CreateSpace(ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: space}}})); err != nil {
			t.Fatal(err)
		}
	}
	tmpl := counterTemplate("counter")
	tmpl.Metadata.Space = "a"
	if _, err := admin.templates.CreateTemplate(ctx, connect.NewRequest(&torporv1.CreateTemplateRequest{Template: tmpl})); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.actors.CreateActor(ctx, connect.NewRequest(&torporv1.CreateActorRequest{Actor: &torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "a", Name: "x"}, Spec: &torporv1.ActorSpec{Template: "counter"},
	}})); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(c clients, f *torporv1.ActorFileRequest) error{
		"stat": func(c clients, f *torporv1.ActorFileRequest) error {
			_, err := c.actors.StatActorFile(ctx, connect.NewRequest(f))
			return err
		},
		"list": func(c clients, f *torporv1.ActorFileRequest) error {
			_, err := c.actors.ListActorFiles(ctx, connect.NewRequest(f))
			return err
		},
		"read": func(c clients, f *torporv1.ActorFileRequest) error {
			s, err := c.actors.ReadActorFiles(ctx, connect.NewRequest(&torporv1.ReadActorFilesRequest{File: f, Archive: true}))
			if err != nil {
				return err
			}
			defer s.Close()
			for s.Receive() {
			}
			return s.Err()
		},
		"write": func(c clients, f *torporv1.ActorFileRequest) error {
			s := c.actors.WriteActorFiles(ctx)
			s.Send(&torporv1.WriteActorFilesRequest{File: f, Data: []byte("x")}) //nolint:errcheck // the answer says
			_, err := s.CloseAndReceive()
			return err
		},
	}
	other := r.clients(testClient(t, r.roots, nil, r.apiToken(t, "b")))
	own := r.clients(testClient(t, r.roots, nil, r.apiToken(t, "a")))
	for name, call := range calls {
		err := call(other, &torporv1.ActorFileRequest{Space: "a", Name: "x", Path: "/data/f"})
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("%s with a token of space b: %v, want PermissionDenied", name, err)
		}
		err = call(own, &torporv1.ActorFileRequest{Space: "a", Name: "x", Path: "/data/../../etc/passwd"})
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "/data/../../etc/passwd") {
			t.Errorf("%s of a path with '..': %v, want InvalidArgument naming it", name, err)
		}
	}
	a, err := admin.actors.GetActor(ctx, connect.NewRequest(&torporv1.GetRequest{Space: "a", Name: "x"}))
	if err != nil {
		t.Fatal(err)
	}
	if st := a.Msg.GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Errorf("after refused calls the actor is %s, want SUSPENDED", st)
	}
}
