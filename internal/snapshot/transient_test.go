package snapshot

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/minio/minio-go/v7"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
	"github.com/torpor-dev/torpor/internal/snapshot/s3test"
)

// TestTransientClassifies errors as they come out of the stores and the
// transfers (wrapped in the names of their object and snapshot).
func TestTransientClassifies(t *testing.T) {
	wrap := func(err error) error {
		return fmt.Errorf("upload snapshot s/a/1: file memory/pages.img: put s/a/1/files/0.zst: %w", err)
	}
	refused := &url.Error{Op: "Put", URL: "http://127.0.0.1:9000/snapshots/k", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
	unverified := &url.Error{Op: "Get", URL: "https://s3.example/snapshots/k", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"reset mid-body", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{"body cut short", io.ErrUnexpectedEOF, true},
		{"dial timeout", &url.Error{Op: "Put", URL: "http://s3/k", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}}, true},
		{"503 SlowDown", minio.ErrorResponse{StatusCode: http.StatusServiceUnavailable, Code: "SlowDown"}, true},
		{"500 InternalError", minio.ErrorResponse{StatusCode: http.StatusInternalServerError, Code: "InternalError"}, true},
		{"502 without a body", minio.ErrorResponse{StatusCode: http.StatusBadGateway, Code: "502 Bad Gateway"}, true},
		{"429", minio.ErrorResponse{StatusCode: http.StatusTooManyRequests, Code: "429 Too Many Requests"}, true},
		{"disk full", &os.PathError{Op: "write", Path: "/var/lib/torpor/snapshots/.incoming/put-1", Err: syscall.ENOSPC}, true},
		{"quota exceeded", &os.PathError{Op: "write", Path: "/x", Err: syscall.EDQUOT}, true},
		{"no such bucket", minio.ErrorResponse{StatusCode: http.StatusNotFound, Code: "NoSuchBucket"}, false},
		{"access denied", minio.ErrorResponse{StatusCode: http.StatusForbidden, Code: "AccessDenied"}, false},
		{"bad signature", minio.ErrorResponse{StatusCode: http.StatusForbidden, Code: "SignatureDoesNotMatch"}, false},
		{"501 not implemented", minio.ErrorResponse{StatusCode: http.StatusNotImplemented, Code: "NotImplemented"}, false},
		{"client-side invalid argument", minio.ErrorResponse{Code: "InvalidArgument"}, false},
		{"certificate not verified", unverified, false},
		{"invalid key", fmt.Errorf("%w %q: empty path segment", ErrInvalidKey, "a//b"), false},
		{"missing object", ErrNotFound, false},
		{"data loss after a transport error", &DataLossError{Location: "s/a/1", Err: refused}, false},
		{"already exists", ErrExists, false},
		{"own deadline", &url.Error{Op: "Put", URL: "http://s3/k", Err: context.DeadlineExceeded}, false},
		{"cancelled", context.Canceled, false},
		{"permission denied", &os.PathError{Op: "open", Path: "/x", Err: syscall.EACCES}, false},
		{"I/O error", &os.PathError{Op: "read", Path: "/x", Err: syscall.EIO}, false},
	} {
		if got := Transient(wrap(c.err)); got != c.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", c.name, wrap(c.err), got, c.want)
		}
	}
	if Transient(nil) {
		t.Error("Transient(nil) = true")
	}
}

// TestTransientFromRealStores classifies what real stores answer: an S3
// server out of reach or overloaded, a full disk (transient); a bucket
// gone, wrong credentials (definite).
func TestTransientFromRealStores(t *testing.T) {
	ctx := context.Background()
	t.Run("S3Refused", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		_, err = NewS3Store(ctx, S3Config{Endpoint: addr, Insecure: true, Bucket: "snapshots", AccessKey: "k", SecretKey: "s"})
		if err == nil || !Transient(err) {
			t.Fatalf("an S3 endpoint that refuses connections: %v, want a transient error", err)
		}
	})
	t.Run("S3SlowDown", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`)
		}))
		defer srv.Close()
		_, err := NewS3Store(ctx, S3Config{Endpoint: strings.TrimPrefix(srv.URL, "http://"), Insecure: true, Bucket: "snapshots", AccessKey: "k", SecretKey: "s"})
		if err == nil || !Transient(err) {
			t.Fatalf("an S3 server answering 503 SlowDown: %v, want a transient error", err)
		}
	})
	t.Run("S3Definite", func(t *testing.T) {
		location := s3test.Location(t, "")
		cfg, err := ParseS3Location(location)
		if err != nil {
			t.Fatal(err)
		}
		cfg.AccessKey, cfg.SecretKey = s3test.AccessKey, "not-the-secret"
		if _, err := NewS3Store(ctx, cfg); err == nil || Transient(err) {
			t.Errorf("wrong credentials: %v, want a definite error", err)
		}
		store, err := Open(ctx, location)
		if err != nil {
			t.Fatal(err)
		}
		s3 := store.(*S3Store)
		if err := s3.client.RemoveBucket(ctx, s3.bucket); err != nil {
			t.Fatal(err)
		}
		if err := store.Put(ctx, "s/a/1/manifest.json", strings.NewReader("{}")); err == nil || Transient(err) {
			t.Errorf("put into a bucket that is gone: %v, want a definite error", err)
		}
	})
	t.Run("DirFull", func(t *testing.T) {
		runtimetest.RequireRoot(t)
		dir := t.TempDir()
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
		store, err := NewDirStore(dir)
		if err != nil {
			t.Fatal(err)
		}
		err = store.Put(ctx, "s/a/1/files/0.zst", io.LimitReader(rand.Reader, 1<<20))
		if !errors.Is(err, syscall.ENOSPC) || !Transient(err) {
			t.Fatalf("put onto a full disk: %v, want a transient ENOSPC", err)
		}
	})
}
