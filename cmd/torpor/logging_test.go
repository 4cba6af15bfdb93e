package main

import (
	"bytes"
	"encoding/json"
	"log"
	"log/slog"
	"strings"
	"testing"
)

func TestLogFlags(t *testing.T) {
	t.Cleanup(func(defaultLogger *slog.Logger) func() {
		return func() { slog.SetDefault(defaultLogger) }
	}(slog.Default()))

	tests := []struct {
		name     string
		flags    logFlags
		wantMsgs []string // of "debug", "info", "warn", "error", "default", "log"
	}{
		{name: "json at info", flags: logFlags{level: "info", format: "json"}, wantMsgs: []string{"info", "warn", "error", "default", "log"}},
		{name: "json at debug", flags: logFlags{level: "debug", format: "json"}, wantMsgs: []string{"debug", "info", "warn", "error", "default", "log"}},
		{name: "json at error: the log package's lines are info", flags: logFlags{level: "ERROR", format: "json"}, wantMsgs: []string{"error"}},
		{name: "text at warn", flags: logFlags{level: "warn", format: "text"}, wantMsgs: []string{"warn", "error", "default"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			logger, err := tt.flags.logger(&buf)
			if err != nil {
				t.Fatal(err)
			}
			logger.Debug("debug", "actor", "a")
			logger.Info("info", "actor", "a")
			logger.Warn("warn", "actor", "a")
			logger.Error("error", "actor", "a")
			// Libraries falling back to the default logger, and the log
			// package (http.Server's error log), come out the same way.
			slog.Default().Warn("default")
			log.Print("log")

			var got []string
			for line := range strings.Lines(buf.String()) {
				if tt.flags.format == "json" {
					var rec map[string]any
					if err := json.Unmarshal([]byte(line), &rec); err != nil {
						t.Fatalf("line %q is not JSON: %v", line, err)
					}
					got = append(got, rec["msg"].(string))
					continue
				}
				if !strings.HasPrefix(line, "time=") {
					t.Fatalf("line %q is not logfmt", line)
				}
				_, msg, _ := strings.Cut(line, "msg=")
				got = append(got, strings.Fields(msg)[0])
			}
			if strings.Join(got, ",") != strings.Join(tt.wantMsgs, ",") {
				t.Errorf("logged %q, want %q", got, tt.wantMsgs)
			}
		})
	}
}

func TestLogFlagsRefuseUnknownValues(t *testing.T) {
	for _, f := range []logFlags{{level: "verbose", format: "text"}, {level: "info", format: "logfmt"}} {
		if _, err := f.logger(&bytes.Buffer{}); err == nil {
			t.Errorf("%+v: no error", f)
		}
	}
}
