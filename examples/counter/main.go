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
// whether the actor reaches beyond its node (egress), and as whom. With
// net=udp it sends a datagram and answers the first line of the reply;
// with net=icmp (addr=HOST) it sends an echo request and answers "echo
// reply" or the error.
//
// GET /resolve?name=NAME answers the addresses NAME resolves to, one a
// line, or 502 with the error.
//
// GET /stream answers a line, "tick N", every 100 ms (every=DURATION)
// until the client goes: a streaming response held open.
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
	mux.HandleFunc("GET /resolve", serveResolve)
	mux.HandleFunc("GET /print", servePrint)
	mux.HandleFunc("GET /stream", serveStream)
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

// serveStream writes a numbered line every period until the client goes.
func serveStream(w http.ResponseWriter, r *http.Request) {
	every := 100 * time.Millisecond
	if v := r.URL.Query().Get("every"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			http.Error(w, "every: want a positive duration", http.StatusBadRequest)
			return
		}
		every = d
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "this connection cannot stream", http.StatusInternalServerError)
		return
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for n := 1; ; n++ {
		if _, err := fmt.Fprintf(w, "tick %d\n", n); err != nil {
			return
		}
		flusher.Flush()
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}

// serveDial connects to the addr parameter and answers the first line the
// server sends, or 502 with the error.
func serveDial(w http.ResponseWriter, r *http.Request) {
	addr := r.URL.Query().Get("addr")
	if addr == "" {
		http.Error(w, "addr=HOST:PORT is required", http.StatusBadRequest)
		return
	}
	network := r.URL.Query().Get("net")
	switch network {
	case "":
		network = "tcp"
	case "icmp":
		servePing(w, addr)
		return
	}
	conn, err := net.DialTimeout(network, addr, 3*time.Second)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	if network == "udp" {
		if _, err := conn.Write([]byte("ping\n")); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	fmt.Fprint(w, line)
}

// serveResolve answers the addresses the name parameter resolves to.
func serveResolve(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, r.URL.Query().Get("name"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	for _, a := range addrs {
		fmt.Fprintln(w, a)
	}
}

// servePing sends one ICMP echo request to host (an unprivileged ping
// socket) and answers whether a reply came.
func servePing(w http.ResponseWriter, host string) {
	c, err := icmpDial(host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	// Type 8 (echo request), code 0, checksum, id, sequence 1.
	msg := []byte{8, 0, 0, 0, 0, 1, 0, 1}
	sum := uint32(0)
	for i := 0; i < len(msg); i += 2 {
		sum += uint32(msg[i])<<8 | uint32(msg[i+1])
	}
	sum = (sum >> 16) + (sum & 0xffff)
	sum += sum >> 16
	msg[2], msg[3] = byte(^sum>>8), byte(^sum)
	if _, err := c.Write(msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if n < 1 || buf[0] != 0 {
		http.Error(w, fmt.Sprintf("ICMP type %d, not an echo reply", buf[0]), http.StatusBadGateway)
		return
	}
	fmt.Fprintln(w, "echo reply")
}

// icmpDial opens an unprivileged ICMP (ping) socket connected to host.
func icmpDial(host string) (*os.File, error) {
	ip := net.ParseIP(host).To4()
	if ip == nil {
		return nil, fmt.Errorf("%q is not an IPv4 address", host)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, syscall.IPPROTO_ICMP)
	if err != nil {
		return nil, fmt.Errorf("ping socket: %w", err)
	}
	if err := syscall.Connect(fd, &syscall.SockaddrInet4{Addr: [4]byte(ip)}); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("ping %s: %w", host, err)
	}
	// Non-blocking, so the file is polled and takes deadlines.
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("ping socket: %w", err)
	}
	return os.NewFile(uintptr(fd), "ping"), nil
}
