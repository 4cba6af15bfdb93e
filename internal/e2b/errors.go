package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
)

// apiError is an answer other than success: an HTTP status and the
// message of its {code, message} body.
type apiError struct {
	status  int
	message string
	// cause is what the log gets for a server-side failure.
	cause error
}

func (e *apiError) Error() string { return fmt.Sprintf("%d: %s", e.status, e.message) }

// badRequest refuses input, naming the field.
func badRequest(field, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, message: field + ": " + fmt.Sprintf(format, args...)}
}

// notFound is what a caller learns of a sandbox it cannot see: whether it
// does not exist or is another space's is not told apart.
func notFound(id string) *apiError {
	return &apiError{status: http.StatusNotFound, message: fmt.Sprintf("sandbox %s not found", id)}
}

// statusOf is the one mapping of a connect call's failure to the E2B
// answer. sandboxID names the sandbox the call was about, "" for calls
// about none (create, list): NotFound about it is "sandbox ID not found",
// the message the SDK's users know.
//
// PermissionDenied about a sandbox is 404, not 403: E2B does not tell a
// sandbox of another team from one that does not exist, and neither
// does the gateway, so a key cannot probe which IDs exist elsewhere.
// ResourceExhausted (no free worker now) is 503, which the SDK reports
// as "service busy, retry"; its 429 means rate limiting and is retried
// only with Retry-After, which capacity cannot promise.
func statusOf(err error, sandboxID string) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	code := connect.CodeOf(err)
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	status := http.StatusInternalServerError
	switch code {
	case connect.CodeNotFound:
		if sandboxID != "" {
			return notFound(sandboxID)
		}
		status = http.StatusNotFound
	case connect.CodePermissionDenied:
		if sandboxID != "" {
			return notFound(sandboxID)
		}
		status = http.StatusForbidden
	case connect.CodeUnauthenticated:
		status = http.StatusUnauthorized
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		status = http.StatusBadRequest
	case connect.CodeFailedPrecondition, connect.CodeAlreadyExists, connect.CodeAborted:
		status = http.StatusConflict
	case connect.CodeResourceExhausted, connect.CodeUnavailable:
		status = http.StatusServiceUnavailable
	case connect.CodeDeadlineExceeded:
		status = http.StatusGatewayTimeout
	case connect.CodeUnimplemented:
		// A control plane older than the gateway's calls.
		status = http.StatusNotImplemented
		msg = "the control plane does not offer this call: " + msg
	case connect.CodeCanceled:
		// The caller went away; nobody reads this.
		status = http.StatusRequestTimeout
	}
	return &apiError{status: status, message: msg, cause: err}
}

// writeJSON answers status with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// The status is out; a failed write is the caller's broken
	// connection, which nothing can answer.
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, errorBody{Code: e.status, Message: e.message})
}
