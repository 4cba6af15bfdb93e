// Command sidecar runs beside the counter example in one sandbox, as a
// pod's sidecar: GET / counts in its own memory, appends a line to the
// counter's request log in the volume they share, then asks the counter
// over localhost and answers "sidecar=N " followed by the counter's
// answer. So one reply shows both containers' memory, their shared
// volume (the counter's line count includes the sidecar's lines) and
// their shared network.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	port := envOr("PORT", "8081")
	upstream := envOr("UPSTREAM", "http://127.0.0.1:8080/")
	logPath := filepath.Join(envOr("DATA_DIR", "/data"), "requests.log")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s := &sidecar{upstream: upstream, logPath: logPath, client: &http.Client{Timeout: 5 * time.Second}}
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", s.serve)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ready") })
	srv := &http.Server{Addr: ":" + port, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	slog.Info("sidecar listening", "addr", srv.Addr, "upstream", upstream, "log", logPath)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		slog.Error("sidecar failed", "err", err)
		os.Exit(1)
	}
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

type sidecar struct {
	upstream, logPath string
	client            *http.Client

	mu    sync.Mutex
	count int64
}

func (s *sidecar) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count++
	if err := appendLine(s.logPath, fmt.Sprintf("sidecar %d %s\n", s.count, time.Now().UTC().Format(time.RFC3339Nano))); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, s.upstream, nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	resp, err := s.client.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		http.Error(w, fmt.Sprintf("upstream %s: %s %s %v", s.upstream, resp.Status, body, err), http.StatusBadGateway)
		return
	}
	fmt.Fprintf(w, "sidecar=%d %s\n", s.count, strings.TrimSpace(string(body)))
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
