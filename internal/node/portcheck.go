package node

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/validate"
)

// defaultPortGrace is how long a start that checks the port waits for a
// listener on the default port, which a template need not use (an actor
// reached by exec only): long enough for a server that binds after it
// started.
const defaultPortGrace = time.Second

// checkPort checks that something in s accepts connections on w's port
// (validate.WorkloadPort), where routers send its traffic. A port the
// template names (containers[0].port, or its HTTP probe's) is polled like
// a readiness probe, within the first container's probe timeout, and
// failing is FailedPrecondition naming the port; the default port gets a
// short grace and, still closed, a warning. An exit meanwhile is
// errExited.
func (pr *prober) checkPort(ctx context.Context, s *slot, w *torporv1.Workload, exited <-chan struct{}) (warning string, err error) {
	spec := w.GetTemplate()
	c := spec.GetContainers()[0]
	port := validate.WorkloadPort(spec)
	named := c.GetPort() > 0 || c.GetReadinessProbe().GetHttpGet().GetPort() > 0
	addr := net.JoinHostPort(s.rt.IP, strconv.Itoa(int(port)))
	r := readiness{what: "TCP " + addr, timeout: defaultPortGrace, period: 100 * time.Millisecond, attemptTimeout: probeAttemptTimeout, attempt: tcpAttempt(addr)}
	if named {
		r.timeout, r.period = defaultProbeTimeout, probeInterval
		if t := c.GetReadinessProbe().GetTimeoutSeconds(); t > 0 {
			r.timeout = time.Duration(t) * time.Second
		}
	}
	ctx, cancel := cancelWhenClosed(ctx, exited, nil)
	defer cancel()
	err = poll(ctx, r)
	select {
	case <-exited:
		return "", errExited
	default:
	}
	switch {
	case err == nil:
		return "", nil
	case named:
		return "", errdefs.Errorf(errdefs.ErrFailedPrecondition, "container %s: nothing accepts connections on port %d, the template's port, where routers send the actor's requests: %w; listen on it, or set containers[0].port to the port the workload listens on", c.GetName(), port, err)
	}
	return fmt.Sprintf("container %s: nothing accepts connections on port %d, the default port (the template names none), within %s: requests through a router will fail; set containers[0].port to the port the workload listens on", c.GetName(), port, defaultPortGrace), nil
}
