package router

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/exits"
)

// subject is what an answer speaks of: "actor <space>/<name>", or
// "sandbox <id>" for a request addressed to a sandbox, whose client may
// know nothing of spaces.
type subject string

func actorSubject(key ActorKey) subject { return subject("actor " + key.String()) }

func sandboxSubject(id string) subject { return subject("sandbox " + id) }

// writeError answers a request the router could not get to its actor or
// sandbox.
func (r *Router) writeError(w *recorder, req *http.Request, rt route, err error) {
	if req.Context().Err() != nil {
		w.err = err // the client went away; nobody reads an answer
		return
	}
	var status int
	var msg string
	if rt.sandbox != nil {
		status, msg = sandboxAnswer(rt.sandbox.id, err)
	} else {
		status, msg = clientAnswer(actorSubject(rt.key), err)
	}
	if status == http.StatusServiceUnavailable {
		// Parked requests already waited the park bound; a retry parks
		// again, so the client may come back at once. An actor whose
		// workload exited comes back when its restart is due.
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter(err, time.Now())))
	}
	if rt.sandbox != nil {
		var stopped *sandboxStopped
		// The SDK asks a sandbox it paused or killed whether it runs
		// (isRunning): that 502 is its answer, not a failure.
		w.expected = errors.As(err, &stopped) || errors.Is(err, errSandboxNotFound)
		w.answerJSON(status, msg, err)
		return
	}
	w.answer(status, msg, err)
}

// closedPort: nothing accepts connections on the actor's port.
type closedPort struct {
	port int
	err  error
}

func (e *closedPort) Error() string { return e.err.Error() }
func (e *closedPort) Unwrap() error { return e.err }

// retryAfter is the seconds a client refused for err may wait before it
// asks again: until the restart of an actor whose workload exited, else
// at once (1).
func retryAfter(err error, now time.Time) int {
	if next := exits.Of(err).GetNextRestartTime(); next != nil {
		return max(1, int(math.Ceil(next.AsTime().Sub(now).Seconds())))
	}
	return 1
}

// exitedAnswer is what the client of an actor whose workload exited is
// told: the container and how it ended, never its output (which may say
// anything, to anyone who can reach the router: the actor's events and
// logs hold it for its users), and when it restarts.
func exitedAnswer(who subject, exited *torporv1.WorkloadExited) (int, string) {
	what := fmt.Sprintf("%s: %s", who, exits.Status(exited.GetExit()))
	if next := exited.GetNextRestartTime(); next != nil {
		return http.StatusServiceUnavailable, fmt.Sprintf("%s; it restarts in %s, retry", what, max(time.Until(next.AsTime()), 0).Round(time.Second))
	}
	return http.StatusBadGateway, fmt.Sprintf("%s and is not restarted (restartPolicy %s)", what, enum.Name(exited.GetRestartPolicy()))
}

// clientAnswer is what the client of a request for an actor is told of
// err: the status and what happened in words that name only the actor. The
// status depends on the code the control plane answered, the words never
// on what it said: its messages speak of workers, uids and node or runtime
// output.
func clientAnswer(who subject, err error) (int, string) {
	var closed *closedPort
	if exited := exits.Of(err); exited != nil {
		return exitedAnswer(who, exited)
	}
	switch {
	case errors.As(err, &closed):
		return http.StatusBadGateway, fmt.Sprintf("%s did not answer: nothing accepts connections on port %d", who, closed.port)
	case errors.Is(err, errNoWorker):
		return http.StatusServiceUnavailable, fmt.Sprintf("%s: %v, retry", who, errNoWorker)
	case errors.Is(err, errControlPlaneDown):
		return http.StatusServiceUnavailable, fmt.Sprintf("%s: %v, retry", who, errControlPlaneDown)
	case errors.Is(err, errGateDown):
		return http.StatusServiceUnavailable, fmt.Sprintf("%s: %v, retry", who, errGateDown)
	case errors.Is(err, errResumeTimeout):
		return http.StatusGatewayTimeout, fmt.Sprintf("%s: %v, retry", who, errResumeTimeout)
	case errors.Is(err, errDeleting):
		return http.StatusConflict, fmt.Sprintf("%s is being deleted", who)
	case errors.Is(err, errNoAnswer):
		return http.StatusBadGateway, fmt.Sprintf("%s did not answer", who)
	}
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return http.StatusNotFound, fmt.Sprintf("%s not found", who)
	case connect.CodePermissionDenied:
		// The router's credentials do not cover the actor's space.
		return http.StatusForbidden, fmt.Sprintf("%s is not served by this router", who)
	case connect.CodeUnauthenticated:
		// The control plane no longer takes the router's own credentials:
		// an operator must act, and the client should know it is not its
		// request.
		return http.StatusBadGateway, "this router's credentials were refused by the control plane (its client was deleted, or its certificate expired): join it with a new token"
	case connect.CodeFailedPrecondition:
		return http.StatusConflict, fmt.Sprintf("%s cannot be resumed now", who)
	}
	if errors.Is(err, errResumeFailed) {
		return http.StatusBadGateway, fmt.Sprintf("%s could not be resumed", who)
	}
	return http.StatusBadGateway, fmt.Sprintf("%s could not be reached", who)
}

// sandboxAnswer is clientAnswer for a request addressed to a sandbox, as
// E2B's edge answers: a sandbox that is not running, or not there at
// all, is 502 (the SDK reads it as "not running": isRunning is false, a
// Connect call fails Unavailable). Transient refusals (no worker, an
// unavailable control plane, a slow resume) keep their 503 and 504.
func sandboxAnswer(id string, err error) (int, string) {
	var stopped *sandboxStopped
	switch {
	case errors.As(err, &stopped):
		return http.StatusBadGateway, fmt.Sprintf("sandbox %s is not running (%s) and was created without autoResume: connect to it to resume it", id, stopped)
	case errors.Is(err, errSandboxNotFound), connect.CodeOf(err) == connect.CodeNotFound:
		return http.StatusBadGateway, fmt.Sprintf("sandbox %s not found: it does not exist, was killed, or is not served by this router", id)
	}
	status, msg := clientAnswer(sandboxSubject(id), err)
	switch status {
	case http.StatusNotFound, http.StatusForbidden, http.StatusConflict:
		status = http.StatusBadGateway
	}
	return status, msg
}
