// Package tracing is Torpor's OpenTelemetry tracing: off unless an OTLP
// endpoint is given, then one trace per activation across router, control
// plane and node agent, the trace context carried by every connect call
// (Interceptor) and the phases of each step as spans (Start).
package tracing

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/otelconnect"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/torpor-dev/torpor/internal/version"
)

// tracerName names the spans' instrumentation scope.
const tracerName = "github.com/torpor-dev/torpor"

// Setup exports this process's spans to the OTLP/HTTP collector at
// endpoint (http://HOST:4318, or a full URL ending in /v1/traces) as
// service, and returns what flushes and stops the export. With no
// endpoint tracing stays off: spans are not recorded, and the trace
// context callers send is still passed on.
func Setup(ctx context.Context, endpoint, service string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if endpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("OTLP endpoint %q: want http(s)://HOST:PORT[/v1/traces]", endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	exporter, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String()))
	if err != nil {
		return nil, fmt.Errorf("OTLP exporter for %s: %w", endpoint, err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName(service), semconv.ServiceVersion(version.Get().Version)))
	if err != nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	provider := sdktrace.NewTracerProvider(
		// A second: an activation's trace is complete soon after it.
		sdktrace.WithBatcher(exporter, sdktrace.WithBatchTimeout(time.Second)),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
	)
	otel.SetTracerProvider(provider)
	return provider.Shutdown, nil
}

// Interceptor makes a span of every connect call, client and server side,
// and carries the trace context across it (W3C traceparent). Servers
// continue the caller's trace: every caller of a Torpor API is one of the
// installation's members or an authenticated client.
func Interceptor() connect.Interceptor {
	i, err := otelconnect.NewInterceptor(otelconnect.WithoutMetrics(), otelconnect.WithTrustRemote())
	if err != nil {
		// Only metric instruments can fail to be made, and there are none.
		panic(fmt.Sprintf("otelconnect interceptor: %v", err))
	}
	return i
}

// Start starts a span named name under ctx's.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return otel.Tracer(tracerName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// Phase records a finished phase of ctx's span, from start to end, as a
// child span.
func Phase(ctx context.Context, name string, start, end time.Time, attrs ...attribute.KeyValue) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return
	}
	_, span := otel.Tracer(tracerName).Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	span.End(trace.WithTimestamp(end))
}

// Detach is a context without ctx's deadline, cancellation and values but
// with its span: for work that outlives the call it belongs to, such as a
// resume many requests wait for.
func Detach(ctx context.Context) context.Context {
	return trace.ContextWithSpanContext(context.Background(), trace.SpanContextFromContext(ctx))
}
