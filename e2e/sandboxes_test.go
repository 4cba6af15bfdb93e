package e2e

import (
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/validate"
)

// e2bClient is an API client holding a new E2B key of space.
func (c *cluster) e2bClient(space string) *http.Client {
	c.t.Helper()
	resp, err := torporv1connect.NewIdentityServiceClient(c.http, c.api).CreateToken(c.ctx, connect.NewRequest(&torporv1.CreateTokenRequest{
		Purpose: torporv1.TokenPurpose_TOKEN_PURPOSE_E2B, Spaces: []string{space},
	}))
	if err != nil {
		c.t.Fatalf("E2B key of space %s: %v", space, err)
	}
	conn := c.conn
	conn.Token = resp.Msg.GetToken()
	hc, err := conn.HTTPClient()
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// TestSandboxesEndToEnd: with an E2B key of its space, SandboxService
// makes a sandbox that runs on gVisor; another space's key reaches it by
// no call; a 3 s lease kills it (the actor is gone, nothing left on the
// node's worker), and a 3 s auto_pause lease suspends it, which stays
// suspended until connect resumes it.
func TestSandboxesEndToEnd(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	if _, err := torporv1connect.NewSpaceServiceClient(c.http, c.api).CreateSpace(c.ctx, connect.NewRequest(&torporv1.CreateSpaceRequest{
		Space: &torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: "other"}},
	})); err != nil {
		t.Fatal(err)
	}
	c.applyTemplate(counterTemplate(t, "counter", nil))
	keyOfDefault, keyOfOther := c.e2bClient("default"), c.e2bClient("other")
	sandboxes := torporv1connect.NewSandboxServiceClient(keyOfDefault, c.api)
	create := func(timeout int32, autoPause bool) *torporv1.Actor {
		t.Helper()
		resp, err := sandboxes.CreateSandbox(c.ctx, connect.NewRequest(&torporv1.CreateSandboxRequest{
			Space: "default", Template: "counter", TimeoutSeconds: timeout, AutoPause: autoPause,
			Labels: map[string]string{"suite": "e2e"}, Env: map[string]string{"GREETING": "hi"}, Secure: true,
		}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg
	}

	sbx := create(300, false)
	id := sbx.GetMetadata().GetName()
	if err := validate.SandboxID("id", id); err != nil || len(id) != 20 {
		t.Fatalf("sandbox ID %q: %v", id, err)
	}
	if sbx.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING || sbx.GetSpec().GetEnvdAccessToken() == "" ||
		sbx.GetSpec().GetEnv()["GREETING"] != "hi" || sbx.GetMetadata().GetLabels()["suite"] != "e2e" || sbx.GetSpec().GetSandbox().GetTimeoutSeconds() != 300 {
		t.Fatalf("created sandbox %v", sbx)
	}
	if got := get(t, sbx); got == "" {
		t.Fatal("the sandbox's workload answered nothing")
	}

	t.Run("another space's key reaches it by no call", func(t *testing.T) {
		otherSandboxes := torporv1connect.NewSandboxServiceClient(keyOfOther, c.api)
		otherActors := torporv1connect.NewActorServiceClient(keyOfOther, c.api)
		for _, tc := range []struct {
			space string
			code  connect.Code
		}{{"other", connect.CodeNotFound}, {"default", connect.CodePermissionDenied}} {
			req := &torporv1.GetRequest{Space: tc.space, Name: id}
			for call, err := range map[string]error{
				"connect": func() error {
					_, err := otherSandboxes.ConnectSandbox(c.ctx, connect.NewRequest(&torporv1.ConnectSandboxRequest{Space: tc.space, SandboxId: id}))
					return err
				}(),
				"set timeout": func() error {
					_, err := otherSandboxes.SetSandboxTimeout(c.ctx, connect.NewRequest(&torporv1.SetSandboxTimeoutRequest{Space: tc.space, SandboxId: id, TimeoutSeconds: 1}))
					return err
				}(),
				"get":     func() error { _, err := otherActors.GetActor(c.ctx, connect.NewRequest(req)); return err }(),
				"suspend": func() error { _, err := otherActors.SuspendActor(c.ctx, connect.NewRequest(req)); return err }(),
				"delete": func() error {
					_, err := otherActors.DeleteActor(c.ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: tc.space, Name: id, Force: true}))
					return err
				}(),
			} {
				if connect.CodeOf(err) != tc.code {
					t.Errorf("%s naming space %s: %v, want %v", call, tc.space, err, tc.code)
				}
			}
		}
		if a := c.actor(id); a.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING || a.GetSpec().GetSandbox().GetEndTime().AsTime().Before(time.Now().Add(time.Minute)) {
			t.Fatalf("after the other space's calls: %v", a)
		}
	})

	t.Run("a lease's end kills it", func(t *testing.T) {
		if _, err := sandboxes.SetSandboxTimeout(c.ctx, connect.NewRequest(&torporv1.SetSandboxTimeoutRequest{Space: "default", SandboxId: id, TimeoutSeconds: 3})); err != nil {
			t.Fatal(err)
		}
		c.waitFor("the lease to kill sandbox "+id, func() bool {
			_, err := c.actors.GetActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: id}))
			return connect.CodeOf(err) == connect.CodeNotFound
		})
		c.waitFor("its worker to be free", func() bool {
			resp, err := c.workers.GetWorker(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: sbx.GetStatus().GetWorker().GetNamespace(), Name: sbx.GetStatus().GetWorker().GetName()}))
			if err != nil {
				t.Fatal(err)
			}
			return resp.Msg.GetStatus().GetActor().GetUid() == ""
		})
		snaps, err := c.snapshots.ListSnapshots(c.ctx, connect.NewRequest(&torporv1.ListRequest{Space: "default"}))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range snaps.Msg.GetSnapshots() {
			if s.GetActorUid() == sbx.GetMetadata().GetUid() {
				t.Errorf("the killed sandbox left snapshot %s", s.GetMetadata().GetName())
			}
		}
	})

	t.Run("an auto_pause lease's end suspends it", func(t *testing.T) {
		paused := create(3, true)
		pid := paused.GetMetadata().GetName()
		c.waitFor("the lease to pause sandbox "+pid, func() bool {
			return c.actor(pid).GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_SUSPENDED
		})
		found := false
		for _, ev := range c.events(pid) {
			found = found || ev.GetReason() == "lease ended: paused (auto_pause): suspended to snapshot storage, resumable on any node"
		}
		if !found {
			t.Errorf("events of %s do not say the lease paused it: %v", pid, c.events(pid))
		}
		// Lease passes after the end leave it paused (one runs a second).
		time.Sleep(2500 * time.Millisecond)
		if st := c.actor(pid).GetStatus().GetState(); st != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
			t.Fatalf("a paused sandbox past its lease is %v, want it left SUSPENDED", st)
		}
		resp, err := sandboxes.ConnectSandbox(c.ctx, connect.NewRequest(&torporv1.ConnectSandboxRequest{Space: "default", SandboxId: pid, TimeoutSeconds: 120}))
		if err != nil {
			t.Fatal(err)
		}
		a := resp.Msg.GetActor()
		if !resp.Msg.GetResumed() || a.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING || a.GetSpec().GetSandbox().GetEndTime().AsTime().Before(time.Now().Add(100*time.Second)) {
			t.Fatalf("connect to the paused sandbox: resumed %v, %v", resp.Msg.GetResumed(), a)
		}
		get(t, a)
		if _, err := c.actors.DeleteActor(c.ctx, connect.NewRequest(&torporv1.DeleteRequest{Space: "default", Name: pid, Force: true})); err != nil {
			t.Fatal(err)
		}
	})
}
