package node

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

const (
	// probeInterval is how often a readiness probe is retried: a restored
	// workload answers a few milliseconds after the runtime returns.
	probeInterval = 5 * time.Millisecond
	// defaultProbeTimeout applies when a probe sets no timeout.
	defaultProbeTimeout = 30 * time.Second
	// probeAttemptTimeout bounds one attempt, so a hung connection does not
	// use up the probe's whole budget in one try.
	probeAttemptTimeout = time.Second
)

// newProbeClient returns the client readiness probes use. Connections are
// not kept: a slot's next workload is another process behind the same
// address.
func newProbeClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// waitReady waits until every container's readiness probe passes against
// the worker's address. A probe that does not pass in time is a
// DeadlineExceeded error naming the actor and the probe.
func (a *Agent) waitReady(ctx context.Context, ip string, w *torporv1.Workload) error {
	for _, c := range w.GetTemplate().GetContainers() {
		p := c.GetReadinessProbe()
		if p.GetHttpGet() == nil {
			continue
		}
		timeout := defaultProbeTimeout
		if p.GetTimeoutSeconds() > 0 {
			timeout = time.Duration(p.GetTimeoutSeconds()) * time.Second
		}
		url := "http://" + net.JoinHostPort(ip, strconv.Itoa(int(p.GetHttpGet().GetPort()))) + "/" + strings.TrimPrefix(p.GetHttpGet().GetPath(), "/")
		if err := a.probe(ctx, url, timeout); err != nil {
			return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("actor %s/%s: container %s: readiness probe GET %s: %w", w.GetSpace(), w.GetActor(), c.GetName(), url, err))
		}
	}
	return nil
}

func (a *Agent) probe(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	tick := time.NewTicker(probeInterval)
	defer tick.Stop()
	var last error
	for {
		err := a.probeOnce(ctx, url)
		if err == nil {
			return nil
		}
		// An attempt cut short by the deadline says less than the one
		// before it.
		if last == nil || ctx.Err() == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("did not pass within %s (last attempt: %w)", timeout, last)
		case <-tick.C:
		}
	}
}

func (a *Agent) probeOnce(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, probeAttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := a.probeClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}
