// Command kv is a Redis-like key-value server small enough for an example:
// it speaks Redis's inline commands (PING, SET, GET, INCR, DEL, QUIT) over
// TCP, keeps its data in memory only, and begins to listen LISTEN_DELAY
// (a Go duration, default 0) after it starts, as a real server that loads
// its data first would. A readiness probe that does not wait for the
// port shows: the server is up but refuses connections for that long.
//
// "kv ping [HOST:PORT]" is its client, as redis-cli ping: it sends PING
// and exits 0 on +PONG, 1 otherwise, so it serves as an exec probe.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	port := envOr("PORT", "6379")
	if len(os.Args) > 1 && os.Args[1] == "ping" {
		addr := net.JoinHostPort("127.0.0.1", port)
		if len(os.Args) > 2 {
			addr = os.Args[2]
		}
		if err := ping(addr); err != nil {
			fmt.Fprintf(os.Stderr, "ping %s: %v\n", addr, err)
			os.Exit(1)
		}
		fmt.Println("PONG")
		return
	}
	delay, err := time.ParseDuration(envOr("LISTEN_DELAY", "0s"))
	if err != nil {
		slog.Error("LISTEN_DELAY is not a duration", "err", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, ":"+port, delay); err != nil {
		slog.Error("kv failed", "err", err)
		os.Exit(1)
	}
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

func serve(ctx context.Context, addr string, delay time.Duration) error {
	slog.Info("kv starting", "addr", addr, "listen_delay", delay)
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	slog.Info("kv listening", "addr", addr)
	s := &store{data: map[string]string{}}
	for {
		conn, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
		go s.handle(conn)
	}
}

type store struct {
	mu   sync.Mutex
	data map[string]string
}

func (s *store) handle(conn net.Conn) {
	defer conn.Close()
	in := bufio.NewScanner(conn)
	for in.Scan() {
		args := strings.Fields(in.Text())
		if len(args) == 0 {
			continue
		}
		reply, quit := s.do(strings.ToUpper(args[0]), args[1:])
		if _, err := conn.Write([]byte(reply + "\r\n")); err != nil || quit {
			return
		}
	}
}

// do runs one command, answering in Redis's protocol.
func (s *store) do(cmd string, args []string) (reply string, quit bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := map[string]int{"PING": 0, "QUIT": 0, "GET": 1, "DEL": 1, "INCR": 1, "SET": 2}
	n, ok := want[cmd]
	switch {
	case !ok:
		return fmt.Sprintf("-ERR unknown command '%s'", cmd), false
	case len(args) != n:
		return fmt.Sprintf("-ERR wrong number of arguments for '%s'", strings.ToLower(cmd)), false
	}
	switch cmd {
	case "PING":
		return "+PONG", false
	case "QUIT":
		return "+OK", true
	case "SET":
		s.data[args[0]] = args[1]
		return "+OK", false
	case "GET":
		v, ok := s.data[args[0]]
		if !ok {
			return "$-1", false
		}
		return fmt.Sprintf("$%d\r\n%s", len(v), v), false
	case "DEL":
		_, ok := s.data[args[0]]
		delete(s.data, args[0])
		if ok {
			return ":1", false
		}
		return ":0", false
	}
	// INCR: a missing key counts as 0.
	var v int64
	if cur, ok := s.data[args[0]]; ok {
		var err error
		if v, err = strconv.ParseInt(cur, 10, 64); err != nil {
			return "-ERR value is not an integer or out of range", false
		}
	}
	v++
	s.data[args[0]] = strconv.FormatInt(v, 10)
	return ":" + s.data[args[0]], false
}

func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return err
	}
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(line); got != "+PONG" {
		return fmt.Errorf("answered %q", got)
	}
	return nil
}
