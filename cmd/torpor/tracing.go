package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/spf13/pflag"

	"github.com/torpor-dev/torpor/internal/tracing"
)

// traceFlags are every process role's --otlp-endpoint.
type traceFlags struct {
	endpoint string
}

func (f *traceFlags) register(flags *pflag.FlagSet) {
	flags.StringVar(&f.endpoint, "otlp-endpoint", "", "send OpenTelemetry traces (OTLP over HTTP) to this collector, e.g. http://127.0.0.1:4318 (default: no tracing)")
}

// start turns tracing on for the role's process, named service; stop
// sends what is left.
func (f *traceFlags) start(service string, logger *slog.Logger) (stop func(), err error) {
	shutdown, err := tracing.Setup(context.Background(), f.endpoint, service)
	if err != nil {
		return nil, err
	}
	if f.endpoint != "" {
		logger.Info("sending traces", "otlp_endpoint", f.endpoint, "service", service)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			logger.Warn("send the last traces", "otlp_endpoint", f.endpoint, "err", err)
		}
	}, nil
}
