package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/runtime"
)

const (
	// probeInterval is how often a readiness probe is retried when it sets
	// no period: a restored workload answers a few milliseconds after the
	// runtime returns.
	probeInterval = 5 * time.Millisecond
	// defaultProbeTimeout applies when a probe sets no timeout.
	defaultProbeTimeout = 30 * time.Second
	// probeAttemptTimeout bounds one HTTP or TCP attempt, so a hung
	// connection does not use up the probe's whole budget in one try.
	probeAttemptTimeout = time.Second
	// execAttemptTimeout bounds one exec attempt: a command in the sandbox
	// may take longer than a connection (runsc starts for each).
	execAttemptTimeout = 10 * time.Second
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

// prober runs workloads' readiness probes.
type prober struct {
	client *http.Client
	rt     runtime.Runtime
}

// readiness is one container's probe, ready to poll.
type readiness struct {
	// what names the probe in errors: "GET http://...", "TCP ip:port",
	// "exec [...]".
	what           string
	timeout        time.Duration
	period         time.Duration
	attemptTimeout time.Duration
	attempt        func(ctx context.Context) error
}

// errExited: the workload exited before it was ready.
var errExited = errors.New("the workload exited")

// waitReady waits until every container's readiness probe passes, all at
// once; a container without one is ready as it runs. A probe that does
// not pass in time is a DeadlineExceeded error naming the actor, the
// container and the probe; the others stop then. A workload that exits
// (exited is closed) is never ready: errExited, at once.
func (pr *prober) waitReady(ctx context.Context, s *slot, w *torporv1.Workload, exited <-chan struct{}) error {
	ctx, cancel := cancelWhenClosed(ctx, exited, nil)
	defer cancel()
	var probes sync.WaitGroup
	defer probes.Wait()

	containers := w.GetTemplate().GetContainers()
	failed := make(chan error, len(containers))
	running := 0
	for _, c := range containers {
		r, ok := pr.readiness(s, c)
		if !ok {
			continue
		}
		running++
		probes.Go(func() {
			err := poll(ctx, r)
			if err != nil {
				err = errdefs.Errorf(context.DeadlineExceeded, "actor %s/%s: container %s: readiness probe %s: %w", w.GetSpace(), w.GetActor(), c.GetName(), r.what, err)
			}
			failed <- err
		})
	}
	var first error
	for range running {
		if err := <-failed; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	select {
	case <-exited:
		return errExited
	default:
	}
	return first
}

// readiness returns container c's probe in slot s, if it has one.
func (pr *prober) readiness(s *slot, c *torporv1.Container) (readiness, bool) {
	p := c.GetReadinessProbe()
	r := readiness{timeout: defaultProbeTimeout, period: probeInterval, attemptTimeout: probeAttemptTimeout}
	if p.GetTimeoutSeconds() > 0 {
		r.timeout = time.Duration(p.GetTimeoutSeconds()) * time.Second
	}
	if p.GetPeriodSeconds() > 0 {
		r.period = time.Duration(p.GetPeriodSeconds()) * time.Second
	}
	switch {
	case p.GetHttpGet() != nil:
		url := "http://" + net.JoinHostPort(s.rt.IP, strconv.Itoa(int(p.GetHttpGet().GetPort()))) + "/" + strings.TrimPrefix(p.GetHttpGet().GetPath(), "/")
		r.what, r.attempt = "GET "+url, pr.httpAttempt(url)
	case p.GetTcpSocket() != nil:
		addr := net.JoinHostPort(s.rt.IP, strconv.Itoa(int(p.GetTcpSocket().GetPort())))
		r.what, r.attempt = "TCP "+addr, tcpAttempt(addr)
	case p.GetExec() != nil:
		cmd := p.GetExec().GetCommand()
		r.what, r.attemptTimeout = fmt.Sprintf("exec %q", cmd), execAttemptTimeout
		r.attempt = func(ctx context.Context) error { return pr.rt.Exec(ctx, s.rt, c.GetName(), cmd) }
	default:
		return readiness{}, false
	}
	return r, true
}

// poll tries r until an attempt passes or r's timeout is over.
func poll(ctx context.Context, r readiness) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	tick := time.NewTicker(r.period)
	defer tick.Stop()
	var last error
	for {
		attemptCtx, cancelAttempt := context.WithTimeout(ctx, r.attemptTimeout)
		err := r.attempt(attemptCtx)
		cancelAttempt()
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
			return fmt.Errorf("did not pass within %s (last attempt: %w)", r.timeout, last)
		case <-tick.C:
		}
	}
}

// httpAttempt passes on a status 200-399 from GET url.
func (pr *prober) httpAttempt(url string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := pr.client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	}
}

// tcpAttempt passes when a connection to addr is accepted.
func tcpAttempt(addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	}
}
