// Command counter is the smallest stateful actor: it counts requests in
// memory and appends one line per request to a file in its durable volume.
// Its answer, "count=N lines=M", shows which state survived a suspend and
// resume: a FULL restore keeps both numbers, a DATA restore keeps only the
// lines, a cold boot keeps neither.
//
// GET /whoami answers the workload identity the node agent gave it: the
// SPIFFE ID and serial number of the certificate in IDENTITY_DIR (default
// /run/torpor/identity), read on every request, so a renewed certificate
// or the fresh one of a restore shows at once.
//
// GET /hostname answers the hostname the actor's sandbox gives it (its
// actor name), read on every request, as a restore may change it.
//
// GET /dial?addr=HOST:PORT answers the first line a TCP server there sends:
// whether the actor reaches beyond its node (egress), and as whom.
//
// GET /print?line=TEXT writes TEXT as a line to its standard output (what
// the node reads into the actor's log) before it answers, so a test can
// have the workload write output when it wants.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
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
	identityDir := envOr("IDENTITY_DIR", "/run/torpor/identity")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, ":"+port, dataDir, identityDir); err != nil {
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

func run(ctx context.Context, addr, dataDir, identityDir string) error {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	c := &counter{logPath: filepath.Join(dataDir, "requests.log")}
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", c.serveCount)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ready")
	})
	certPath := filepath.Join(identityDir, "cert.pem")
	mux.HandleFunc("GET /whoami", func(w http.ResponseWriter, _ *http.Request) { serveWhoami(w, certPath) })
	mux.HandleFunc("GET /hostname", serveHostname)
	mux.HandleFunc("GET /dial", serveDial)
	mux.HandleFunc("GET /print", servePrint)
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

func serveHostname(w http.ResponseWriter, _ *http.Request) {
	name, err := os.Hostname()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	fmt.Fprintln(w, name)
}

// serveWhoami answers "<SPIFFE ID> serial=<hex>" from the certificate at
// certPath (its first PEM block), or 503 while there is none.
func serveWhoami(w http.ResponseWriter, certPath string) {
	data, err := os.ReadFile(certPath)
	if errors.Is(err, fs.ErrNotExist) {
		http.Error(w, "no workload identity yet", http.StatusServiceUnavailable)
		return
	}
	if err != nil {
		slog.Error("reading workload certificate", "path", certPath, "err", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		slog.Error("workload certificate holds no CERTIFICATE block", "path", certPath)
		http.Error(w, certPath+": no CERTIFICATE block", http.StatusInternalServerError)
		return
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		slog.Error("parsing workload certificate", "path", certPath, "err", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if len(cert.URIs) != 1 {
		http.Error(w, fmt.Sprintf("%s names %d URIs, want one SPIFFE ID", certPath, len(cert.URIs)), http.StatusInternalServerError)
		return
	}
	fmt.Fprintf(w, "%s serial=%s\n", cert.URIs[0], cert.SerialNumber.Text(16))
}

// servePrint writes the line parameter to standard output, unbuffered,
// and answers once it is written.
func servePrint(w http.ResponseWriter, r *http.Request) {
	if _, err := fmt.Println(r.URL.Query().Get("line")); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	fmt.Fprintln(w, "printed")
}

// serveDial connects to the addr parameter and answers the first line the
// server sends, or 502 with the error.
func serveDial(w http.ResponseWriter, r *http.Request) {
	addr := r.URL.Query().Get("addr")
	if addr == "" {
		http.Error(w, "addr=HOST:PORT is required", http.StatusBadRequest)
		return
	}
	conn, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	fmt.Fprint(w, line)
}
