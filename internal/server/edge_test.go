package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Streaming procedures (logs, files, exec, placements) meet the same edge
// as unary ones: an error of a kind from the engine or the store reaches
// the client with its code, never as unknown.
func TestEdgeMapsErrorsOfEveryProcedureKind(t *testing.T) {
	const (
		unary        = "/torpor.test.Edge/Unary"
		serverStream = "/torpor.test.Edge/ServerStream"
		clientStream = "/torpor.test.Edge/ClientStream"
	)
	var fail error
	opts := connect.WithInterceptors(edgeErrors{log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	mux := http.NewServeMux()
	mux.Handle(unary, connect.NewUnaryHandler(unary, func(context.Context, *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error) {
		return nil, fail
	}, opts))
	mux.Handle(serverStream, connect.NewServerStreamHandler(serverStream, func(context.Context, *connect.Request[torporv1.GetRequest], *connect.ServerStream[torporv1.Actor]) error {
		return fail
	}, opts))
	mux.Handle(clientStream, connect.NewClientStreamHandler(clientStream, func(context.Context, *connect.ClientStream[torporv1.GetRequest]) (*connect.Response[torporv1.Actor], error) {
		return nil, fail
	}, opts))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := context.Background()
	calls := map[string]func() error{
		"unary": func() error {
			_, err := connect.NewClient[torporv1.GetRequest, torporv1.Actor](srv.Client(), srv.URL+unary).CallUnary(ctx, connect.NewRequest(&torporv1.GetRequest{}))
			return err
		},
		"server stream": func() error {
			s, err := connect.NewClient[torporv1.GetRequest, torporv1.Actor](srv.Client(), srv.URL+serverStream).CallServerStream(ctx, connect.NewRequest(&torporv1.GetRequest{}))
			if err != nil {
				return err
			}
			defer s.Close()
			for s.Receive() {
			}
			return s.Err()
		},
		"client stream": func() error {
			s := connect.NewClient[torporv1.GetRequest, torporv1.Actor](srv.Client(), srv.URL+clientStream).CallClientStream(ctx)
			_ = s.Send(&torporv1.GetRequest{}) // the answer says
			_, err := s.CloseAndReceive()
			return err
		},
	}
	tests := []struct {
		name string
		err  error
		want connect.Code
	}{
		{"invalid name", fmt.Errorf("actor %q: name: %w", "Bad Name", errdefs.ErrInvalidArgument), connect.CodeInvalidArgument},
		{"store unavailable", fmt.Errorf("store: %w", errdefs.ErrUnavailable), connect.CodeUnavailable},
		{"not found", fmt.Errorf("actor default/x: %w", errdefs.ErrNotFound), connect.CodeNotFound},
	}
	for _, tt := range tests {
		for kind, call := range calls {
			t.Run(tt.name+"/"+kind, func(t *testing.T) {
				fail = tt.err
				if got := connect.CodeOf(call()); got != tt.want {
					t.Errorf("%s failing with %q: code %v, want %v", kind, tt.err, got, tt.want)
				}
			})
		}
	}
}
