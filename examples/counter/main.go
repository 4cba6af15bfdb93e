// Command counter is the smallest stateful actor: it counts requests in
// memory and appends one line per request to a file in its durable volume.
// Its answer, "count=N lines=M", shows which state survived a suspend and
// resume: a FULL restore keeps both numbers, a DATA restore keeps only the
// lines, a cold boot keeps neither.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

func main() {
	port := envOr("PORT", "8080")
	dataDir := envOr("DATA_DIR", "/data")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, ":"+port, dataDir); err != nil {
		slog.Error("counter failed", "err", err)
		os.Exit(1)
	}
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

func run(ctx context.Context, addr, dataDir string) error {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	c := &counter{logPath: filepath.Join(dataDir, "requests.log")}
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", c.serveCount)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ready")
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	slog.Info("counter listening", "addr", addr, "log", c.logPath)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type counter struct {
	logPath string

	mu    sync.Mutex
	count int64
}

func (c *counter) serveCount(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.count++
	// The file is reopened and recounted on every request, not tracked in
	// memory: a restore onto the template's golden memory image puts this
	// actor's volume under a process that has never seen it.
	if err := appendLine(c.logPath, fmt.Sprintf("request %d %s %s\n", c.count, time.Now().UTC().Format(time.RFC3339Nano), r.RemoteAddr)); err != nil {
		slog.Error("appending request", "log", c.logPath, "err", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	content, err := os.ReadFile(c.logPath)
	if err != nil {
		slog.Error("reading request log", "log", c.logPath, "err", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	fmt.Fprintf(w, "count=%d lines=%d\n", c.count, bytes.Count(content, []byte("\n")))
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
