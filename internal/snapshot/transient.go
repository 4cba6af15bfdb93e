package snapshot

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"

	"github.com/minio/minio-go/v7"
)

// Transient reports whether err is a fault of snapshot storage, or of the
// local disk a snapshot is written to, that passes without the request
// changing: the object store out of reach (refused, reset, cut short,
// timed out), answering 5xx or asking to slow down, or a full disk that
// an operator frees. Repeating the operation may then succeed, so a
// caller keeps what it needs for the repeat. A missing bucket, denied
// access, an invalid key or location, a snapshot that is missing or
// corrupt, a certificate that does not verify, or the caller's own
// deadline or cancellation is definite.
func Transient(err error) bool {
	switch {
	case err == nil,
		errors.Is(err, ErrDataLoss), errors.Is(err, ErrNotFound), errors.Is(err, ErrInvalidKey), errors.Is(err, ErrExists),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	case DiskFull(err):
		return true
	}
	// The S3 client wraps an unverified certificate in a transport error.
	var unverified *tls.CertificateVerificationError
	if errors.As(err, &unverified) {
		return false
	}
	var answer minio.ErrorResponse
	if errors.As(err, &answer) {
		return s3Transient(answer)
	}
	// A failed HTTP exchange, a network operation (dial, read, write,
	// name lookup), or a response body cut short by a dropped
	// connection. (Not any net.Error: every errno is one, a local disk's
	// too.)
	var exchange *url.Error
	var network *net.OpError
	var lookup *net.DNSError
	return errors.As(err, &exchange) || errors.As(err, &network) || errors.As(err, &lookup) || errors.Is(err, io.ErrUnexpectedEOF)
}

// DiskFull reports whether err is a write that found its filesystem (or
// the user's quota) full.
func DiskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// s3Transient tells an S3 answer that asks to come back later from one
// that will not change: the codes S3 and S3-compatible servers use for
// overload and outages, and server errors but 501 (an unsupported
// request stays unsupported).
func s3Transient(answer minio.ErrorResponse) bool {
	switch answer.Code {
	case "SlowDown", "SlowDownRead", "SlowDownWrite", "ServiceUnavailable", "InternalError", "RequestTimeout",
		"Throttling", "ThrottlingException", "RequestLimitExceeded", "RequestThrottled", "XMinioServerNotInitialized":
		return true
	}
	switch s := answer.StatusCode; {
	case s == http.StatusRequestTimeout, s == http.StatusTooManyRequests:
		return true
	case s >= 500:
		return s != http.StatusNotImplemented
	}
	return false
}
