package slotgate

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

// echoServer answers each line with name and the line, so a test can tell
// which workload it reached.
func echoServer(t *testing.T, name string) (ip string, port int) {
	t.Helper()
	return lineServer(t, func(line string) string { return name + " " + line })
}

// lineServer is a workload answering each line it reads with answer(line)
// (which keeps the line's newline, or adds one).
func lineServer(t *testing.T, answer func(line string) string) (ip string, port int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					io.WriteString(c, answer(line)) //nolint:errcheck // the reader sees a short answer
				}
			}()
		}
	}()
	a := ln.Addr().(*net.TCPAddr)
	return a.IP.String(), a.Port
}

func startGate(t *testing.T) (*Gate, string) {
	t.Helper()
	return startGateWith(t, Options{})
}

func startGateWith(t *testing.T, opts Options) (*Gate, string) {
	t.Helper()
	g := New(slog.New(slog.DiscardHandler), opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return g, ln.Addr().String()
}

func ask(t *testing.T, c net.Conn, line string) (string, error) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func TestGateAdmitsOnlyTheSlotsActor(t *testing.T) {
	g, addr := startGate(t)
	ip, port := echoServer(t, "a")
	g.Occupy("w0", ip, "uid-a", Freeze{})
	d := &net.Dialer{}
	ctx := context.Background()

	c, err := Dial(ctx, d, Target{Gate: addr, Worker: "w0", ActorUID: "uid-a", Port: port})
	if err != nil {
		t.Fatalf("dial the slot's actor: %v", err)
	}
	defer c.Close()
	if got, err := ask(t, c, "hi"); err != nil || got != "a hi\n" {
		t.Fatalf("through the gate: %q, %v; want %q", got, err, "a hi\n")
	}

	for _, target := range []Target{
		{Gate: addr, Worker: "w0", ActorUID: "uid-b", Port: port},
		{Gate: addr, Worker: "w9", ActorUID: "uid-a", Port: port},
	} {
		if _, err := Dial(ctx, d, target); !errors.Is(err, ErrStale) {
			t.Errorf("dial %s: %v, want ErrStale", target, err)
		}
	}

	// The slot changes hands: the admitted connection ends at once,
	// although the workload it reached still listens.
	g.Occupy("w0", ip, "uid-b", Freeze{})
	if got, err := ask(t, c, "again"); err == nil {
		t.Fatalf("a connection admitted for the previous actor still answers: %q", got)
	}
	if _, err := Dial(ctx, d, Target{Gate: addr, Worker: "w0", ActorUID: "uid-a", Port: port}); !errors.Is(err, ErrStale) {
		t.Errorf("dial the previous actor: %v, want ErrStale", err)
	}
	c2, err := Dial(ctx, d, Target{Gate: addr, Worker: "w0", ActorUID: "uid-b", Port: port})
	if err != nil {
		t.Fatalf("dial the new actor: %v", err)
	}
	c2.Close()
}

func TestGateReportsAWorkloadNotListening(t *testing.T) {
	g, addr := startGate(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	g.Occupy("w0", "127.0.0.1", "uid-a", Freeze{})
	if _, err := Dial(context.Background(), &net.Dialer{}, Target{Gate: addr, Worker: "w0", ActorUID: "uid-a", Port: port}); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("dial a port nothing listens on: %v, want ErrUnreachable", err)
	}
}

func TestGateRefusesMalformedRequests(t *testing.T) {
	_, addr := startGate(t)
	for _, line := range []string{"GET / HTTP/1.1", magic + " w0 uid-a notaport", magic + " w0 uid-a 0", strings.Repeat("x", 2*maxLine)} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := ask(t, c, line)
		c.Close()
		if strings.HasPrefix(got, answerOK) {
			t.Errorf("request %.40q admitted", line)
		}
	}
}
