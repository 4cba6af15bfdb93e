package envd

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor/api/gen/envd/filesystem/filesystemconnect"
	"github.com/torpor-dev/torpor/api/gen/envd/process/processconnect"
)

// testToken is the access token of the test daemons.
const testToken = "test-token"

// daemon is a Server on loopback with clients speaking as the SDK does
// (Connect protocol, JSON).
type daemon struct {
	url     string
	process processconnect.ProcessClient
	fs      filesystemconnect.FilesystemClient
}

func startDaemon(t *testing.T, cfg Config) *daemon {
	t.Helper()
	s := New(cfg, nil)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		srv.Close()
		s.Close()
	})
	opts := []connect.ClientOption{connect.WithProtoJSON(), connect.WithInterceptors(tokenInterceptor(cfg.AccessToken))}
	return &daemon{
		url:     srv.URL,
		process: processconnect.NewProcessClient(srv.Client(), srv.URL, opts...),
		fs:      filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, opts...),
	}
}

// tokenInterceptor sends the access token, as the SDK does on every call.
func tokenInterceptor(token string) connect.Interceptor {
	return headerInterceptor(func(h http.Header) {
		if token != "" {
			h.Set(accessTokenHeader, token)
		}
	})
}

type headerInterceptor func(http.Header)

func (f headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		f(req.Header())
		return next(ctx, req)
	}
}

func (f headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		f(conn.RequestHeader())
		return conn
	}
}

func (f headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func wantCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("error %v: want code %v", err, code)
	}
}

// processClient is a process client of d sending token.
func processClient(d *daemon, token string) processconnect.ProcessClient {
	return processconnect.NewProcessClient(http.DefaultClient, d.url, connect.WithProtoJSON(), connect.WithInterceptors(tokenInterceptor(token)))
}
