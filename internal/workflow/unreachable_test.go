package workflow

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// A node's own outcome is an answer, whatever its kind; only a call that
// got no answer, or a node saying it cannot take it now, is repeated. A
// readiness probe's deadline, answered by the node, used to be taken for
// a timeout of the call (context.DeadlineExceeded is a net.Error), and a
// golden build whose probe never passes was built again forever.
func TestUnreachableTellsAnswersFromSilence(t *testing.T) {
	const procedure = "/test.Node/Call"
	silent := make(chan struct{})
	answer := func(err error) string {
		mux := http.NewServeMux()
		mux.Handle(procedure, connect.NewUnaryHandler(procedure, func(ctx context.Context, _ *connect.Request[emptypb.Empty]) (*connect.Response[emptypb.Empty], error) {
			if err == nil {
				// Answers nothing, not even its own deadline's end,
				// before the caller gives up.
				<-silent
				return nil, ctx.Err()
			}
			return nil, errdefs.ToConnect(err) // as the node's edge does
		}))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		t.Cleanup(func() {
			if err == nil {
				close(silent)
			}
		})
		return srv.URL
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	cases := []struct {
		name        string
		url         string
		unreachable bool
	}{
		{"the node's readiness deadline", answer(errdefs.Errorf(context.DeadlineExceeded, "readiness probe: did not pass within 3s")), false},
		{"the node's refusal", answer(errdefs.New(errdefs.ErrFailedPrecondition, "worker w1 hosts actor a2")), false},
		{"the node says unavailable", answer(errdefs.New(errdefs.ErrUnavailable, "agent starting")), true},
		{"the node stopped mid-operation", answer(context.Canceled), true},
		{"no answer before the caller's deadline", answer(nil), true},
		{"connection refused", closed.URL, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client := connect.NewClient[emptypb.Empty, emptypb.Empty](http.DefaultClient, tc.url+procedure)
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			_, err := client.CallUnary(ctx, connect.NewRequest(&emptypb.Empty{}))
			if err == nil {
				t.Fatal("the call succeeded")
			}
			// As the engine sees it: through its node-call boundary.
			err = errdefs.FromConnect(err)
			if got := unreachable(err); got != tc.unreachable {
				t.Errorf("unreachable(%v) = %v, want %v", err, got, tc.unreachable)
			}
		})
	}
}
