package e2b

import (
	"context"
	"encoding/json"
	"net/http"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/validate"
)

// maxRefreshSeconds is the longest refresh E2B accepts.
const maxRefreshSeconds = 3600

// createV1 is POST /sandboxes (SDK 2.50): secure unless the body says
// secure=false.
func (g *Gateway) createV1(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	return g.create(ctx, w, r, c, false)
}

// createV2 is POST /v2/sandboxes (SDK 2.51): always secure, as E2B's v2
// is.
func (g *Gateway) createV2(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	return g.create(ctx, w, r, c, true)
}

func (g *Gateway) create(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller, alwaysSecure bool) error {
	var body newSandbox
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if body.TemplateID == "" {
		return badRequest("templateID", "required: the name of a template in the key's space")
	}
	if err := refuseUnsupported(body); err != nil {
		return err
	}
	timeout, err := seconds("timeout", body.Timeout)
	if err != nil {
		return err
	}
	policy, err := sandboxEgress(body)
	if err != nil {
		return err
	}
	secure := alwaysSecure || body.Secure == nil || *body.Secure
	resp, err := g.sandboxes.CreateSandbox(ctx, withKey(&torporv1.CreateSandboxRequest{
		Space:          c.space,
		Template:       body.TemplateID,
		Labels:         body.Metadata,
		Env:            body.EnvVars,
		TimeoutSeconds: timeout,
		AutoPause:      body.AutoPause != nil && *body.AutoPause,
		AutoResume:     body.AutoResume != nil && body.AutoResume.Enabled,
		Secure:         secure,
		Egress:         policy,
	}, c.key))
	if err != nil {
		if policy.GetMode() == torporv1.EgressMode_EGRESS_MODE_ALLOWLIST {
			// The control plane names the policy's rules; the caller
			// wrote allowOut entries.
			ae := statusOf(err, "")
			ae.message = nameAllowOut(ae.message, body.Network.AllowOut)
			return ae
		}
		return err
	}
	writeJSON(w, http.StatusCreated, g.sandboxOf(resp.Msg))
	return nil
}

// refuseUnsupported refuses, naming the field, what a create asks that
// Torpor cannot honour, rather than ignoring it.
func refuseUnsupported(b newSandbox) error {
	if b.AutoPauseMemory != nil && !*b.AutoPauseMemory {
		return badRequest("autoPauseMemory", "false is not supported: a pause keeps the sandbox's memory")
	}
	var n networkBody
	if b.Network != nil {
		n = *b.Network
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{
		{"mcp", b.MCP},
		{"iam", b.IAM},
		{"volumeMounts", b.VolumeMounts},
		{"network.allowPublicTraffic", n.AllowPublicTraffic},
		{"network.maskRequestHost", n.MaskRequestHost},
		{"network.httpsPorts", n.HTTPSPorts},
		{"network.rules", n.Rules},
		{"network.egressProxy", n.EgressProxy},
	} {
		if len(f.raw) > 0 && string(f.raw) != "null" {
			return badRequest(f.name, "not supported by Torpor's E2B API")
		}
	}
	return nil
}

// seconds is an optional timeout in seconds, 0 when absent.
func seconds(field string, v *int32) (int32, error) {
	if v == nil {
		return 0, nil
	}
	if *v < 0 {
		return 0, badRequest(field, "%d is negative; want seconds", *v)
	}
	return *v, nil
}

// sandboxID is the path's sandbox ID. One that cannot be a sandbox's is
// 404: no sandbox has it.
func sandboxID(r *http.Request) (string, error) {
	id := r.PathValue("sandboxID")
	if err := validate.SandboxID("sandboxID", id); err != nil {
		return "", &apiError{status: http.StatusNotFound, message: "sandbox " + id + " not found: " + statusOf(err, "").message}
	}
	return id, nil
}

// getSandbox returns the sandbox id of the caller's space; an actor that
// is not a sandbox is not found.
func (g *Gateway) getSandbox(ctx context.Context, c caller, id string) (*torporv1.Actor, error) {
	resp, err := g.actors.GetActor(ctx, withKey(&torporv1.GetRequest{Space: c.space, Name: id}, c.key))
	if err != nil {
		return nil, err
	}
	if !isSandbox(resp.Msg) {
		return nil, notFound(id)
	}
	return resp.Msg, nil
}

// kill is DELETE /sandboxes/{id}: the workload stops without a snapshot
// and the sandbox is gone (DeleteActor with force), 204.
func (g *Gateway) kill(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	a, err := g.getSandbox(ctx, c, id)
	if err != nil {
		return err
	}
	// The uid makes sure the delete takes the sandbox just looked at.
	if _, err := g.actors.DeleteActor(ctx, withKey(&torporv1.DeleteRequest{Space: c.space, Name: id, Uid: a.GetMetadata().GetUid(), Force: true}, c.key)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// pause is POST /sandboxes/{id}/pause: SuspendActor, a durable snapshot
// the sandbox resumes from on any node, 204; 409 when it is paused
// already.
func (g *Gateway) pause(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var body pauseBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if body.Memory != nil && !*body.Memory {
		return badRequest("memory", "false is not supported: a pause keeps the sandbox's memory")
	}
	a, err := g.getSandbox(ctx, c, id)
	if err != nil {
		return err
	}
	if stateOf(a.GetStatus().GetState()) == statePaused {
		return &apiError{status: http.StatusConflict, message: "sandbox " + id + " is already paused"}
	}
	if _, err := g.actors.SuspendActor(ctx, withKey(&torporv1.GetRequest{Space: c.space, Name: id}, c.key)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect is POST /v2/sandboxes/{id}/connect (SDK 2.51) and POST
// /sandboxes/{id}/connect (2.50): ConnectSandbox, 201 when it resumed the
// sandbox, 200 when it was running. A timeout left out is the sandbox's
// own (the one it was created with).
func (g *Gateway) connect(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var body connectBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if body.Memory != nil && !*body.Memory {
		return badRequest("memory", "false (resume without memory, onResume: reboot) is not supported")
	}
	if body.AutoPause != nil {
		return badRequest("autoPause", "not taken here: set it when creating the sandbox")
	}
	timeout, err := seconds("timeout", body.Timeout)
	if err != nil {
		return err
	}
	resp, err := g.sandboxes.ConnectSandbox(ctx, withKey(&torporv1.ConnectSandboxRequest{Space: c.space, SandboxId: id, TimeoutSeconds: timeout}, c.key))
	if err != nil {
		return err
	}
	status := http.StatusOK
	if resp.Msg.GetResumed() {
		status = http.StatusCreated
	}
	writeJSON(w, status, g.sandboxOf(resp.Msg.GetActor()))
	return nil
}

// resume is the deprecated POST /sandboxes/{id}/resume: as connect, but
// 409 for a running sandbox, and always 201.
func (g *Gateway) resume(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	a, err := g.getSandbox(ctx, c, id)
	if err != nil {
		return err
	}
	if stateOf(a.GetStatus().GetState()) == stateRunning {
		return &apiError{status: http.StatusConflict, message: "sandbox " + id + " is already running"}
	}
	return g.connect(ctx, &createdOnly{ResponseWriter: w}, r, c)
}

// createdOnly answers 201 where connect answers 200 (it raced with
// another resume): the deprecated resume knows only 201.
type createdOnly struct{ http.ResponseWriter }

func (w *createdOnly) WriteHeader(status int) {
	if status == http.StatusOK {
		status = http.StatusCreated
	}
	w.ResponseWriter.WriteHeader(status)
}

// setTimeout is POST /sandboxes/{id}/timeout: the lease ends timeout
// seconds from now, earlier or later than it did, 204.
func (g *Gateway) setTimeout(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var body timeoutBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if body.Timeout == nil {
		return badRequest("timeout", "required: seconds from now")
	}
	timeout, err := seconds("timeout", body.Timeout)
	if err != nil {
		return err
	}
	if _, err := g.sandboxes.SetSandboxTimeout(ctx, withKey(&torporv1.SetSandboxTimeoutRequest{Space: c.space, SandboxId: id, TimeoutSeconds: timeout}, c.key)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// refresh is POST /sandboxes/{id}/refreshes: a running sandbox's lease
// ends no earlier than duration seconds from now (its own timeout when
// left out), 204; a paused one is 404, as E2B has it.
func (g *Gateway) refresh(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	var body refreshBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	duration, err := seconds("duration", body.Duration)
	if err != nil {
		return err
	}
	if duration > maxRefreshSeconds {
		return badRequest("duration", "%d is more than %d seconds", duration, maxRefreshSeconds)
	}
	a, err := g.getSandbox(ctx, c, id)
	if err != nil {
		return err
	}
	if stateOf(a.GetStatus().GetState()) != stateRunning {
		return &apiError{status: http.StatusNotFound, message: "sandbox " + id + " is not running"}
	}
	// Connect on a running sandbox only ever extends its lease.
	if _, err := g.sandboxes.ConnectSandbox(ctx, withKey(&torporv1.ConnectSandboxRequest{Space: c.space, SandboxId: id, TimeoutSeconds: duration}, c.key)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
