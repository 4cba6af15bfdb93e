package server

// The data plane's calls reach inside an actor's sandbox through the node
// agent that runs it: exec resumes the actor first, as a router's request
// does, and keeps it active while it lasts; stats and logs (logs.go) only
// read, and are no activity.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// ExecActor runs a process in the actor (see the API): the first request
// names it, the node agent holding the actor runs it, and input and
// output are relayed both ways until it exits.
func (s *actorService) ExecActor(ctx context.Context, stream *connect.BidiStream[torporv1.ExecActorRequest, torporv1.ExecOutput]) error {
	first, err := stream.Receive()
	if err != nil {
		return err
	}
	if err := keyOf(first.GetSpace(), first.GetName(), true); err != nil {
		return err
	}
	if len(first.GetProcess().GetCommand()) == 0 {
		return invalidArgument("process.command", "required")
	}
	end := s.sessions.begin(ctx, first.GetSpace(), first.GetName())
	defer end()
	a, agent, err := s.placed(ctx, first.GetSpace(), first.GetName())
	if err != nil {
		return err
	}
	node := agent.Exec(ctx)
	defer node.CloseResponse()
	err = node.Send(&torporv1.ExecRequest{Worker: a.GetStatus().GetWorker().GetName(), ActorUid: a.GetMetadata().GetUid(), Process: first.GetProcess()})
	if err != nil && !errors.Is(err, io.EOF) {
		return dataPlaneError("exec in", a, err)
	}
	s.relays.Go(func() {
		defer node.CloseRequest()
		for {
			req, err := stream.Receive()
			if err != nil {
				return
			}
			if err := node.Send(&torporv1.ExecRequest{Input: req.GetInput()}); err != nil {
				return
			}
		}
	})
	for {
		out, err := node.Receive()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return dataPlaneError("exec in", a, err)
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

// GetActorStats reports the actor's resource use (from its node, while it
// runs) and its snapshots' sizes.
func (s *actorService) GetActorStats(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.ActorStats], error) {
	a, err := get(ctx, s.store.Actors(), req.Msg, true)
	if err != nil {
		return nil, err
	}
	st := a.GetStatus()
	out := &torporv1.ActorStats{State: st.GetState()}
	snaps, err := store.ListAll(ctx, s.store.Snapshots(), store.ListOptions{Space: a.GetMetadata().GetSpace(), Filter: store.Filter{"actor_uid": a.GetMetadata().GetUid()}})
	if err != nil {
		return nil, err
	}
	for _, sn := range snaps {
		out.Snapshots++
		out.SnapshotsBytes += sn.GetSizeBytes()
		if sn.GetMetadata().GetName() == st.GetLatestSnapshot() {
			out.LatestSnapshotBytes = sn.GetSizeBytes()
		}
	}
	if st.GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING {
		return connect.NewResponse(out), nil
	}
	w := st.GetWorker()
	out.Node, out.Worker = w.GetNode(), w.GetName()
	agent, err := s.agents.client(ctx, w.GetNode())
	if err != nil {
		return nil, err
	}
	resp, err := agent.Stats(ctx, connect.NewRequest(&torporv1.StatsRequest{Worker: w.GetName()}))
	if err != nil {
		return nil, dataPlaneError("stats of", a, err)
	}
	// The actor may have left the worker since it was read.
	if resp.Msg.GetActorUid() == a.GetMetadata().GetUid() && resp.Msg.GetRunning() {
		out.CpuSeconds, out.MemoryBytes, out.Started = resp.Msg.GetCpuSeconds(), resp.Msg.GetMemoryBytes(), resp.Msg.GetStarted()
	}
	return connect.NewResponse(out), nil
}

// placed resumes the actor (a RUNNING one is returned as it is) and
// returns it with the agent of the node it runs on.
func (s *actorService) placed(ctx context.Context, space, name string) (*torporv1.Actor, torporv1connect.NodeAgentServiceClient, error) {
	a, err := s.engine.Resume(ctx, space, name, workflow.ResumeOptions{})
	if err != nil {
		return nil, nil, errdefs.ToConnect(err)
	}
	agent, err := s.agents.client(ctx, a.GetStatus().GetWorker().GetNode())
	if err != nil {
		return nil, nil, errdefs.ToConnect(err)
	}
	return a, agent, nil
}

// dataPlaneError names the actor in a node agent's answer, keeping its
// code (a process or a log the agent could not reach).
func dataPlaneError(what string, a *torporv1.Actor, err error) error {
	return errdefs.ToConnect(fmt.Errorf("%s actor %s/%s: %w", what, a.GetMetadata().GetSpace(), a.GetMetadata().GetName(), err))
}

// sessions counts the data-plane calls in flight per actor and reports
// them as activity, so the idle policy and eviction leave an actor alone
// while someone works in it, and count its end as its last activity.
// Each server reports under a name of its own: in-flight counts are per
// reporter.
type sessions struct {
	store    store.Store
	log      *slog.Logger
	reporter string

	mu   sync.Mutex
	open map[sessionKey]int
}

type sessionKey struct{ space, name string }

// sessionRefresh: an in-flight count is re-reported well within the time
// after which it is no longer believed (10 s).
const sessionRefresh = 3 * time.Second

func newSessions(st store.Store, log *slog.Logger) *sessions {
	b := make([]byte, 6)
	rand.Read(b)
	return &sessions{store: st, log: log, reporter: "data-plane-" + hex.EncodeToString(b), open: map[sessionKey]int{}}
}

// begin reports a session for the actor before the caller looks the actor
// up (so an idle stop claimed meanwhile sees it and is cancelled), and
// keeps reporting it until end.
func (t *sessions) begin(ctx context.Context, space, name string) (end func()) {
	k := sessionKey{space, name}
	t.mu.Lock()
	t.open[k]++
	t.mu.Unlock()
	t.report(ctx, k)
	stop := make(chan struct{})
	var refresh sync.WaitGroup
	refresh.Go(func() {
		tick := time.NewTicker(sessionRefresh)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				t.report(context.WithoutCancel(ctx), k)
			}
		}
	})
	return func() {
		close(stop)
		refresh.Wait()
		t.mu.Lock()
		if t.open[k]--; t.open[k] == 0 {
			delete(t.open, k)
		}
		t.mu.Unlock()
		t.report(context.WithoutCancel(ctx), k)
	}
}

func (t *sessions) report(ctx context.Context, k sessionKey) {
	t.mu.Lock()
	n := t.open[k]
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := t.store.RecordActivity(ctx, []store.Activity{{Space: k.space, Name: k.name, Reporter: t.reporter, LastActive: time.Now(), InFlight: n}})
	if err != nil {
		// Costs the actor at most an early idle stop, not the call.
		t.log.Warn("record data-plane activity", "space", k.space, "actor", k.name, "err", err)
	}
}
