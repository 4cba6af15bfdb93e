package tracing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
)

// spaces answers GetSpace after recording a phase under the call's span.
type spaces struct {
	torporv1connect.UnimplementedSpaceServiceHandler
}

func (spaces) GetSpace(ctx context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.Space], error) {
	end := time.Now()
	Phase(ctx, "lookup", end.Add(-time.Millisecond), end)
	return connect.NewResponse(&torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: req.Msg.GetName()}}), nil
}

// TestOneTraceAcrossACall: a span started by the caller, the client and
// server spans of the connect call and a phase recorded by the handler
// are one trace, each the child of the one before.
func TestOneTraceAcrossACall(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer provider.Shutdown(context.Background())
	otel.SetTracerProvider(provider)
	if _, err := Setup(context.Background(), "", "test"); err != nil {
		t.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle(torporv1connect.NewSpaceServiceHandler(spaces{}, connect.WithInterceptors(Interceptor())))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := torporv1connect.NewSpaceServiceClient(srv.Client(), srv.URL, connect.WithInterceptors(Interceptor()))

	ctx, root := Start(context.Background(), "activation")
	if _, err := client.GetSpace(ctx, connect.NewRequest(&torporv1.GetRequest{Name: "s"})); err != nil {
		t.Fatal(err)
	}
	root.End()

	const rpc = "torpor.v1.SpaceService/GetSpace"
	chain := []struct {
		name string
		kind trace.SpanKind
	}{{"activation", trace.SpanKindInternal}, {rpc, trace.SpanKindClient}, {rpc, trace.SpanKindServer}, {"lookup", trace.SpanKindInternal}}
	var parent sdktrace.ReadOnlySpan
	for _, want := range chain {
		i := slices.IndexFunc(spans.Ended(), func(s sdktrace.ReadOnlySpan) bool { return s.Name() == want.name && s.SpanKind() == want.kind })
		if i < 0 {
			t.Fatalf("no %s span %q among %v", want.kind, want.name, names(spans.Ended()))
		}
		s := spans.Ended()[i]
		if s.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("%s: trace %s, want %s", want.name, s.SpanContext().TraceID(), root.SpanContext().TraceID())
		}
		if parent != nil && s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s %s: parent %s, want %s", want.kind, want.name, s.Parent().SpanID(), parent.SpanContext().SpanID())
		}
		parent = s
	}
	if d := parent.EndTime().Sub(parent.StartTime()); d != time.Millisecond {
		t.Errorf("phase lasted %s, want the 1ms it was given", d)
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name()+"/"+s.SpanKind().String())
	}
	return out
}

// TestSetupEndpoint: an endpoint that is no http(s) URL is refused.
func TestSetupEndpoint(t *testing.T) {
	for _, bad := range []string{"127.0.0.1:4318", "grpc://host:4317", "http://"} {
		if _, err := Setup(context.Background(), bad, "test"); err == nil {
			t.Errorf("Setup(%q) accepted it", bad)
		}
	}
	shutdown, err := Setup(context.Background(), "http://127.0.0.1:1", "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Logf("shutdown with nothing exported: %v", err)
	}
}
