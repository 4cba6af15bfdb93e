package main

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"
)

// logFlags are every process role's --log-level and --log-format.
type logFlags struct {
	level  string
	format string
}

// register adds the flags to a role's persistent flags; defaultLevel is the
// role's own (up talks to a person at a terminal, so it says less).
func (f *logFlags) register(flags *pflag.FlagSet, defaultLevel string) {
	flags.StringVar(&f.level, "log-level", defaultLevel, "lowest level logged: debug, info, warn or error")
	flags.StringVar(&f.format, "log-format", "text", "log line format: text (logfmt) or json (one object a line)")
}

var logLevels = map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}

// logger builds the role's logger on w and makes it the default, so lines
// from the log package and from code that falls back to slog.Default come
// out in the same format and at the same level.
func (f *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	level, ok := logLevels[strings.ToLower(f.level)]
	if !ok {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.level)
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch f.format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", f.format)
	}
	logger := slog.New(h)
	slog.SetDefault(logger)
	return logger, nil
}
