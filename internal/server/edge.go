package server

import (
	"context"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// edgeErrors gives every failed call, unary or streaming, the status code
// a user can act on (errdefs.ToConnect: the engine and the store return
// errors of a kind, not codes) and logs it with its procedure; server-side
// faults at error level, caller mistakes at debug.
type edgeErrors struct{ log *slog.Logger }

var _ connect.Interceptor = edgeErrors{}

func (e edgeErrors) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		resp, err := next(ctx, req)
		return resp, e.failed(ctx, req.Spec().Procedure, start, err)
	}
}

func (e edgeErrors) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		return e.failed(ctx, conn.Spec().Procedure, start, next(ctx, conn))
	}
}

// WrapStreamingClient leaves the server's own outgoing streams alone: the
// edge is where calls come in.
func (edgeErrors) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// failed maps err, if any, to its code and logs it.
func (e edgeErrors) failed(ctx context.Context, procedure string, start time.Time, err error) error {
	if err == nil {
		return nil
	}
	err = errdefs.ToConnect(err)
	level := slog.LevelDebug
	switch connect.CodeOf(err) {
	case connect.CodeInternal, connect.CodeUnknown, connect.CodeDataLoss:
		level = slog.LevelError
	case connect.CodeUnavailable:
		// The store or a node out of reach: an operator wants to see it
		// even though the client may retry.
		level = slog.LevelWarn
	}
	e.log.Log(ctx, level, "call failed", "procedure", procedure, "code", connect.CodeOf(err).String(), "err", err, "duration", time.Since(start))
	return err
}
