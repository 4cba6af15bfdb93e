package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/store"
	"github.com/torpor-dev/torpor/internal/validate"
	"github.com/torpor-dev/torpor/internal/workflow"
)

// Sandbox leases, in seconds (CreateSandboxRequest.timeout_seconds and the
// others). The longest is a day, E2B's own longest.
const (
	DefaultSandboxTimeoutSeconds = 300
	MaxSandboxTimeoutSeconds     = 24 * 60 * 60
)

const (
	// sandboxIDLen: 20 of 36 symbols, about 103 random bits.
	sandboxIDLen = 20
	// sandboxIDAttempts: a new ID taken already is all but impossible;
	// a few tries cover it.
	sandboxIDAttempts = 5
)

// sandboxService is the control-plane half of the E2B-compatible API: a
// sandbox is an actor named by its sandbox ID whose spec.sandbox holds
// its lease (workflow/leases.go).
type sandboxService struct {
	store  store.Store
	engine *workflow.Engine
	log    *slog.Logger
}

// CreateSandbox makes an actor of the template named by a new sandbox ID,
// with a lease of timeout_seconds from now, and starts it. A sandbox that
// fails to start is deleted, so a failed create leaves nothing behind.
func (s *sandboxService) CreateSandbox(ctx context.Context, req *connect.Request[torporv1.CreateSandboxRequest]) (*connect.Response[torporv1.Actor], error) {
	m := req.Msg
	if err := validate.Name("space", m.GetSpace()); err != nil {
		return nil, err
	}
	if err := validate.Name("template", m.GetTemplate()); err != nil {
		return nil, err
	}
	if err := validate.Labels("labels", m.GetLabels()); err != nil {
		return nil, err
	}
	if err := validate.Env("env", m.GetEnv()); err != nil {
		return nil, err
	}
	timeout := m.GetTimeoutSeconds()
	if timeout == 0 {
		timeout = DefaultSandboxTimeoutSeconds
	}
	if err := checkSandboxTimeout(timeout); err != nil {
		return nil, err
	}
	space := m.GetSpace()
	policy, err := admitEgress(ctx, s.store, space, m.GetEgress(), "egress")
	if err != nil {
		return nil, err
	}
	if _, err := s.store.Templates().Get(ctx, space, m.GetTemplate()); isNotFound(err) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("template: no template %q in space %q", m.GetTemplate(), space))
	} else if err != nil {
		return nil, err
	}
	now := time.Now()
	spec := &torporv1.ActorSpec{
		Template: m.GetTemplate(),
		Env:      m.GetEnv(),
		Sandbox: &torporv1.Sandbox{
			EndTime:        timestamppb.New(now.Add(time.Duration(timeout) * time.Second)),
			AutoPause:      m.GetAutoPause(),
			AutoResume:     m.GetAutoResume(),
			StartTime:      timestamppb.New(now),
			TimeoutSeconds: timeout,
		},
	}
	if m.GetSecure() {
		spec.EnvdAccessToken = randomHex(32)
	}
	var id string
	for range sandboxIDAttempts {
		id = newSandboxID()
		_, err = createSuspendedActor(ctx, s.store, &torporv1.ObjectMeta{Space: space, Name: id, Labels: m.GetLabels()}, spec, policy)
		if !errors.Is(err, store.ErrAlreadyExists) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	a, err := s.engine.Resume(ctx, space, id, workflow.ResumeOptions{})
	if err != nil {
		// A caller that gave up leaves a resume that goes on; the
		// sandbox's lease ends it.
		if ctx.Err() == nil {
			if derr := s.engine.Delete(ctx, space, id, workflow.DeleteOptions{Force: true}); derr != nil && !isNotFound(derr) {
				s.log.WarnContext(ctx, "a sandbox that failed to start is left", "sandbox", space+"/"+id, "err", derr)
			}
		}
		return nil, fmt.Errorf("start sandbox %s: %w", id, err)
	}
	return connect.NewResponse(a), nil
}

// ConnectSandbox moves the lease end to now + timeout_seconds when that is
// later, then resumes the sandbox unless it runs. The lease moves first,
// so its old end cannot stop the sandbox just resumed.
func (s *sandboxService) ConnectSandbox(ctx context.Context, req *connect.Request[torporv1.ConnectSandboxRequest]) (*connect.Response[torporv1.ConnectSandboxResponse], error) {
	m := req.Msg
	if err := sandboxKey(m.GetSpace(), m.GetSandboxId()); err != nil {
		return nil, err
	}
	if m.GetTimeoutSeconds() != 0 {
		if err := checkSandboxTimeout(m.GetTimeoutSeconds()); err != nil {
			return nil, err
		}
	}
	a, err := s.engine.UpdateLease(ctx, m.GetSpace(), m.GetSandboxId(), workflow.LeaseUpdate{
		Timeout: time.Duration(m.GetTimeoutSeconds()) * time.Second, ExtendOnly: true,
	})
	if err != nil {
		return nil, err
	}
	if a.GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING {
		return connect.NewResponse(&torporv1.ConnectSandboxResponse{Actor: a}), nil
	}
	a, err = s.engine.Resume(ctx, m.GetSpace(), m.GetSandboxId(), workflow.ResumeOptions{})
	if err != nil {
		return nil, fmt.Errorf("resume sandbox %s: %w", m.GetSandboxId(), err)
	}
	return connect.NewResponse(&torporv1.ConnectSandboxResponse{Actor: a, Resumed: true}), nil
}

// SetSandboxTimeout sets the lease end to now + timeout_seconds, earlier
// or later; 0 ends the lease now.
func (s *sandboxService) SetSandboxTimeout(ctx context.Context, req *connect.Request[torporv1.SetSandboxTimeoutRequest]) (*connect.Response[torporv1.Actor], error) {
	m := req.Msg
	if err := sandboxKey(m.GetSpace(), m.GetSandboxId()); err != nil {
		return nil, err
	}
	if m.GetTimeoutSeconds() != 0 {
		if err := checkSandboxTimeout(m.GetTimeoutSeconds()); err != nil {
			return nil, err
		}
	}
	a, err := s.engine.UpdateLease(ctx, m.GetSpace(), m.GetSandboxId(), workflow.LeaseUpdate{Timeout: time.Duration(m.GetTimeoutSeconds()) * time.Second})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(a), nil
}

// ListSandboxes pages through the space's sandboxes by ID, those with
// every label asked for and, when states are given, in one of them (else
// in any but DELETING).
func (s *sandboxService) ListSandboxes(ctx context.Context, req *connect.Request[torporv1.ListSandboxesRequest]) (*connect.Response[torporv1.ListSandboxesResponse], error) {
	m := req.Msg
	space := m.GetSpace()
	if err := validate.Name("space", space); err != nil {
		return nil, err
	}
	if m.GetPageSize() < 0 || m.GetPageSize() > store.MaxPageSize {
		return nil, invalidArgument("pageSize", "%d is outside 0..%d", m.GetPageSize(), store.MaxPageSize)
	}
	for i, st := range m.GetStates() {
		if _, known := torporv1.ActorState_name[int32(st)]; !known || st == torporv1.ActorState_ACTOR_STATE_UNSPECIFIED {
			return nil, invalidArgument(fmt.Sprintf("states[%d]", i), "%d is not an actor state", st)
		}
	}
	size := int(m.GetPageSize())
	if size == 0 {
		size = store.DefaultPageSize
	}
	opts := store.ListOptions{Space: space, PageToken: m.GetPageToken()}
	if len(m.GetStates()) == 1 {
		opts.Filter = store.Filter{"state": m.GetStates()[0].String()}
	}
	resp := &torporv1.ListSandboxesResponse{}
	for a, err := range store.All(ctx, s.store.Actors(), opts) {
		if errors.Is(err, errdefs.ErrInvalidArgument) {
			return nil, invalidArgument("pageToken", "%v", err)
		}
		if err != nil {
			return nil, fmt.Errorf("list the sandboxes of space %s: %w", space, err)
		}
		if !isListedSandbox(a, m.GetLabels(), m.GetStates()) {
			continue
		}
		if len(resp.Actors) == size {
			last := resp.Actors[size-1].GetMetadata()
			resp.NextPageToken = store.PageTokenAfter(last.GetSpace(), last.GetName())
			break
		}
		resp.Actors = append(resp.Actors, a)
	}
	return connect.NewResponse(resp), nil
}

// isListedSandbox: a is a sandbox with every one of labels and, when
// states are given, in one of them; without states, one being deleted
// (killed, for E2B) is not listed.
func isListedSandbox(a *torporv1.Actor, labels map[string]string, states []torporv1.ActorState) bool {
	if a.GetSpec().GetSandbox() == nil {
		return false
	}
	state := a.GetStatus().GetState()
	if len(states) > 0 && !slices.Contains(states, state) || len(states) == 0 && state == torporv1.ActorState_ACTOR_STATE_DELETING {
		return false
	}
	for k, v := range labels {
		if got, ok := a.GetMetadata().GetLabels()[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func sandboxKey(space, id string) error {
	if err := validate.Name("space", space); err != nil {
		return err
	}
	return validate.SandboxID("sandboxId", id)
}

func checkSandboxTimeout(seconds int32) error {
	if seconds < 1 || seconds > MaxSandboxTimeoutSeconds {
		return invalidArgument("timeoutSeconds", "%d is outside 1..%d (a day)", seconds, MaxSandboxTimeoutSeconds)
	}
	return nil
}

// newSandboxID returns a random sandbox ID: lower-case letters and
// digits, each equally likely (bytes past the last whole multiple of 36
// are drawn again).
func newSandboxID() string {
	const symbols = "abcdefghijklmnopqrstuvwxyz0123456789"
	const limit = 256 - 256%len(symbols)
	id := make([]byte, 0, sandboxIDLen)
	buf := make([]byte, sandboxIDLen)
	for len(id) < sandboxIDLen {
		rand.Read(buf)
		for _, b := range buf {
			if int(b) < limit && len(id) < sandboxIDLen {
				id = append(id, symbols[int(b)%len(symbols)])
			}
		}
	}
	return string(id)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
