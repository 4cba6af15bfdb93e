package e2b

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
)

// InProcessURL is the base URL of calls an InProcess client serves; its
// host names no network address.
const InProcessURL = "http://torpor.in-process"

// InProcess is an HTTP client whose requests h serves in this process, no
// network hop: the gateway mounted in the control plane calls the
// server's own connect handlers (gate included) this way. It serves
// unary calls, the only ones the gateway makes: a response is whole
// when h returns.
func InProcess(h http.Handler) *http.Client {
	return &http.Client{Transport: handlerTransport{h}}
}

type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	// The inner call keeps the outer one's deadline and cancellation but
	// none of its values: what the API port's TLS layer learned of the
	// E2B caller (a client certificate) must not count for the call the
	// gateway makes with the caller's key.
	inner := req.Clone(withoutValues{req.Context()})
	inner.RequestURI = req.URL.RequestURI()
	inner.Host = req.URL.Host
	inner.RemoteAddr = "in-process"
	if inner.Body == nil {
		inner.Body = http.NoBody
	}
	if inner.Proto == "" {
		inner.Proto, inner.ProtoMajor, inner.ProtoMinor = "HTTP/1.1", 1, 1
	}
	w := &bufferedResponse{header: http.Header{}}
	t.h.ServeHTTP(w, inner)
	if err := req.Context().Err(); err != nil {
		return nil, fmt.Errorf("in-process call %s: %w", req.URL.Path, err)
	}
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return &http.Response{
		Status:        fmt.Sprintf("%d %s", w.status, http.StatusText(w.status)),
		StatusCode:    w.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.header,
		Body:          io.NopCloser(bytes.NewReader(w.body.Bytes())),
		ContentLength: int64(w.body.Len()),
		Request:       req,
	}, nil
}

// withoutValues is a context with its parent's deadline and cancellation and
// no values.
type withoutValues struct{ context.Context }

func (withoutValues) Value(any) any { return nil }

// bufferedResponse keeps what a handler answers.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *bufferedResponse) Header() http.Header { return w.header }

func (w *bufferedResponse) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *bufferedResponse) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}
