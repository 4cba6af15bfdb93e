// Package e2b is the E2B-compatible REST control plane: it speaks the
// JSON API the published E2B SDK calls (sandboxes: create, connect,
// pause, kill, info, list, timeout, metrics) and translates each call
// into Torpor's connect API (SandboxService, ActorService). It is a
// gateway and knows nothing of the store: it presents the caller's E2B
// key (X-API-KEY) as the bearer token of every call it makes, so the
// server's gate decides what the key may see and touch.
package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
	"github.com/torpor-dev/torpor/internal/envd"
)

// EnvdVersion is the version of the in-sandbox API (envd) the gateway
// announces: the SDK turns on what each version added (0.5.2 CloseStdin,
// 0.5.7 octet-stream uploads), and refuses one below 0.1.0.
const EnvdVersion = envd.Version

// Prefixes are the paths the gateway serves, for a mux it is mounted in
// (each as a pattern of its own: "/sandboxes" and "/sandboxes/...").
var Prefixes = []string{"/sandboxes", "/sandboxes/", "/v2/sandboxes", "/v2/sandboxes/"}

// maxBodyBytes bounds a request body: E2B's bodies are small JSON.
const maxBodyBytes = 1 << 20

// Config configures a gateway.
type Config struct {
	// APIURL is the base URL of Torpor's API (InProcessURL with an
	// InProcess client).
	APIURL string
	// HTTPClient makes the connect calls.
	HTTPClient connect.HTTPClient
	// Domain is the domain answered to the SDK, which reaches a
	// sandbox's port at <port>-<sandboxID>.<domain> (it may carry a
	// port: "actors.localhost:7080").
	Domain string
	Logger *slog.Logger
	// Now is the clock (tests set it); default time.Now.
	Now func() time.Time
}

// Gateway serves E2B's REST API over Torpor's connect API.
type Gateway struct {
	sandboxes torporv1connect.SandboxServiceClient
	actors    torporv1connect.ActorServiceClient
	keys      *keySpaces
	domain    string
	log       *slog.Logger
	now       func() time.Time
}

// New returns a gateway calling the API cfg names.
func New(cfg Config) *Gateway {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Gateway{
		sandboxes: torporv1connect.NewSandboxServiceClient(cfg.HTTPClient, cfg.APIURL),
		actors:    torporv1connect.NewActorServiceClient(cfg.HTTPClient, cfg.APIURL),
		keys: &keySpaces{
			spaces: torporv1connect.NewSpaceServiceClient(cfg.HTTPClient, cfg.APIURL),
			now:    cfg.Now,
			known:  map[[32]byte]rememberedSpace{},
		},
		domain: cfg.Domain,
		log:    cfg.Logger,
		now:    cfg.Now,
	}
}

// caller is who makes an E2B call: the key it presented and the space
// the key is of.
type caller struct {
	key   string
	space string
}

// endpoint is an E2B call's handler: it answers, or returns the error to
// answer.
type endpoint func(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error

// Handler serves the E2B paths (Prefixes).
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	routes := []struct {
		pattern string
		serve   endpoint
	}{
		{"POST /sandboxes", g.createV1},
		{"POST /v2/sandboxes", g.createV2},
		{"GET /sandboxes", g.listRunning},
		{"GET /v2/sandboxes", g.list},
		{"GET /sandboxes/{sandboxID}", g.get},
		{"DELETE /sandboxes/{sandboxID}", g.kill},
		{"POST /sandboxes/{sandboxID}/pause", g.pause},
		{"POST /sandboxes/{sandboxID}/connect", g.connect},
		{"POST /v2/sandboxes/{sandboxID}/connect", g.connect},
		{"POST /sandboxes/{sandboxID}/resume", g.resume},
		{"POST /sandboxes/{sandboxID}/timeout", g.setTimeout},
		{"POST /sandboxes/{sandboxID}/refreshes", g.refresh},
		{"GET /sandboxes/{sandboxID}/metrics", g.metrics},
	}
	for _, rt := range routes {
		mux.Handle(rt.pattern, g.serve(rt.serve))
	}
	// The rest of E2B's sandbox API (fork, snapshots, network, logs) is
	// not offered. 501 rather than 404: the SDK reads 404 as "no such
	// sandbox".
	unsupported := func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotImplemented, message: r.Method + " " + r.URL.Path + ": not offered by Torpor's E2B API (see docs/e2b.md)"})
	}
	mux.HandleFunc("/sandboxes/", unsupported)
	mux.HandleFunc("/v2/sandboxes/", unsupported)
	return mux
}

// serve authenticates the caller and answers what e returns.
func (g *Gateway) serve(e endpoint) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		id := r.PathValue("sandboxID")
		key := r.Header.Get("X-API-KEY")
		if key == "" {
			writeError(w, &apiError{status: http.StatusUnauthorized, message: "X-API-KEY: required, an E2B API key of one space (torpor token create --spaces SPACE --e2b)"})
			return
		}
		space, err := g.keys.of(ctx, key)
		if err == nil {
			err = e(ctx, w, r, caller{key: key, space: space})
		}
		if err == nil {
			return
		}
		ae := statusOf(err, id)
		if ae.status == http.StatusUnauthorized {
			g.keys.forget(key)
		}
		if ae.status >= 500 {
			g.log.ErrorContext(ctx, "E2B call failed", "method", r.Method, "path", r.URL.Path, "status", ae.status, "err", errors.Join(ae, ae.cause))
		}
		writeError(w, ae)
	})
}

// decodeBody reads r's JSON body into v; an empty body leaves v as it
// is (the SDK sends none where every field is optional).
func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	if err != nil {
		return badRequest("body", "%v", err)
	}
	if len(body) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("body", "not the JSON this call takes: %v", err)
	}
	return nil
}
