package node

// The in-sandbox API of E2B sandboxes. A workload that is one (Workload
// envd, or an access token for it) gets the envd daemon (internal/envd),
// from the node's own binary, which enters the sandbox through the
// identity directory as the file helper does.
//
// A cold boot runs the first container's process under the daemon's
// supervisor (`torpor envd init`, runtime.Workload.Init), which serves
// the API from the container's own process tree: what it starts is
// checkpointed with the sandbox and restored with it, so a restored
// sandbox brings back the daemon, its process table and its processes.
// After every start and restore the node asks the daemon's /health over
// the worker's network; when none answers it execs `torpor envd` (the
// launcher, config on stdin), which returns once the API answers and
// starts a detached daemon when none does: a sandbox restored from a
// template's golden snapshot has no supervisor. Such a daemon came from
// an exec, which runsc kills (with what it started) when it restores the
// sandbox; the next start's launch brings a new one.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/envd"
	"github.com/torpor-dev/torpor/internal/runtime"
)

// wantsEnvd reports whether w is an E2B sandbox, which gets the daemon.
func wantsEnvd(w *torporv1.Workload) bool {
	return w.GetEnvd() || w.GetEnvdAccessToken() != ""
}

// envdConfigFile is the supervisor's config in the identity directory,
// readable by root only.
const envdConfigFile = "envd.json"

// placeEnvd prepares s's identity directory before the sandbox starts:
// the helper binary (a restored daemon runs from that file, which the
// restore opens again at its path) and the supervisor's config. It
// returns the supervisor's argument vector.
func (m *slotMachine) placeEnvd(s *slot, w *torporv1.Workload) ([]string, error) {
	if !wantsEnvd(w) {
		return nil, nil
	}
	helper, err := m.guest.place(s, m.identity.dir(s))
	if err != nil {
		return nil, fmt.Errorf("actor %s/%s: the in-sandbox API: %w", w.GetSpace(), w.GetActor(), err)
	}
	cfg, err := envdConfig(w)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(m.identity.dir(s), envdConfigFile), cfg, 0o600); err != nil {
		return nil, fmt.Errorf("actor %s/%s: the in-sandbox API's config: %w", w.GetSpace(), w.GetActor(), err)
	}
	return []string{helper, envd.Command, "init", "--config", IdentityMountPath + "/" + envdConfigFile, "--"}, nil
}

func envdConfig(w *torporv1.Workload) ([]byte, error) {
	cfg, err := json.Marshal(envd.Config{AccessToken: w.GetEnvdAccessToken(), Env: w.GetEnv()})
	if err != nil {
		return nil, fmt.Errorf("actor %s/%s: the in-sandbox API's config: %w", w.GetSpace(), w.GetActor(), err)
	}
	return cfg, nil
}

// supervisedEnvdWait bounds how long the node asks a supervised
// sandbox's daemon for /health before it execs the launcher instead.
const supervisedEnvdWait = 2 * time.Second

// ensureEnvd makes sure the daemon serves in s's running sandbox, in its
// first container (whose user and environment it takes); supervised, the
// supervisor's daemon is waited for first. The node asks it over the
// worker's network before it runs the launcher: a supervised sandbox's
// daemon answers within milliseconds of a start or restore, and an exec
// costs a runsc process (hundreds of milliseconds here).
func (m *slotMachine) ensureEnvd(ctx context.Context, s *slot, w *torporv1.Workload, supervised bool) error {
	if !wantsEnvd(w) {
		return nil
	}
	if supervised && m.envdAnswers(ctx, s) {
		return nil
	}
	helper, err := m.guest.place(s, m.identity.dir(s))
	if err != nil {
		return fmt.Errorf("actor %s/%s: the in-sandbox API: %w", w.GetSpace(), w.GetActor(), err)
	}
	cfg, err := envdConfig(w)
	if err != nil {
		return err
	}
	cmd := []string{helper, envd.Command}
	if supervised {
		cmd = append(cmd, "--await")
	}
	var stderr bytes.Buffer
	code, err := m.rt.ExecStream(ctx, s.rt, runtime.ExecSpec{
		Command: cmd, Stdin: bytes.NewReader(cfg), Stdout: io.Discard, Stderr: &limitedBuffer{b: &stderr},
	})
	if err != nil {
		return fmt.Errorf("actor %s/%s on worker %s: start the in-sandbox API: %w", w.GetSpace(), w.GetActor(), s.name(), err)
	}
	if code != 0 {
		return fmt.Errorf("actor %s/%s on worker %s: start the in-sandbox API: exit status %d: %s", w.GetSpace(), w.GetActor(), s.name(), code, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// envdAnswers reports whether s's daemon answers /health within
// supervisedEnvdWait.
func (m *slotMachine) envdAnswers(ctx context.Context, s *slot) bool {
	ctx, cancel := context.WithTimeout(ctx, supervisedEnvdWait)
	defer cancel()
	url := "http://" + net.JoinHostPort(s.rt.IP, strconv.Itoa(envd.Port)) + "/health"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false
		}
		if resp, err := m.probes.client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return true
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}
