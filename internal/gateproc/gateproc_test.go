package gateproc

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/slotgate"
)

// childEnv makes the test binary the gate process (its Command).
const childEnv = "TORPOR_GATEPROC_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		fs := flag.NewFlagSet("gate", flag.ExitOnError)
		var opts Options
		fs.StringVar(&opts.StateDir, "state-dir", "", "")
		fs.StringVar(&opts.Listen, "listen", "", "")
		_ = fs.Parse(os.Args[1:])
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
		opts.Pausers = func(control string) slotgate.Pauser { return filePauser(control) }
		if err := Run(context.Background(), opts); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// newClient is a client whose gate process is this test binary; the gate
// it leaves is killed at the test's end.
func newClient(t *testing.T, dir string) *Client {
	t.Helper()
	t.Setenv(childEnv, "1")
	c := NewClient(Config{StateDir: dir, Command: []string{os.Args[0]}, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() {
		if pid, ok := running(dir); ok {
			_ = kill(pid, nil)
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, logFile))
			t.Logf("gate log:\n%s", b)
		}
	})
	return c
}

// echo is a workload answering each line with its name and the line.
func echo(t *testing.T, name string) (string, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					fmt.Fprintf(c, "%s %s", name, line)
				}
			})
		}
	})
	a := ln.Addr().(*net.TCPAddr)
	return a.IP.String(), a.Port
}

func dialGate(t *testing.T, gate, worker, actor string, port int) (net.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return slotgate.Dial(ctx, &net.Dialer{}, slotgate.Target{Gate: gate, Worker: worker, ActorUID: actor, Port: port})
}

// roundTrip sends a line on c and returns the answer, or the error.
func roundTrip(c net.Conn, line string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func mustAnswer(t *testing.T, c net.Conn, line, want string) {
	t.Helper()
	got, err := roundTrip(c, line)
	if err != nil || got != want+"\n" {
		t.Fatalf("through the gate: %q, %v; want %q", got, err, want)
	}
}

// TestGateOutlivesItsClient: the gate a client started serves the
// occupants it was told before Start; a second client (the restarted
// agent) adopts it, and a connection spliced before goes on through it.
func TestGateOutlivesItsClient(t *testing.T) {
	dir := t.TempDir()
	ip, port := echo(t, "a")
	c := newClient(t, dir)
	c.Occupy("w0", ip, "uid-a", slotgate.Freeze{})
	addr, err := c.Start(context.Background(), "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := running(dir)
	if fi, err := os.Stat(SocketPath(dir)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket: %v %v, want mode 0600", fi, err)
	}
	conn, err := dialGate(t, addr, "w0", "uid-a", port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mustAnswer(t, conn, "one", "a one")
	if _, err := dialGate(t, addr, "w0", "uid-b", port); !errors.Is(err, slotgate.ErrStale) {
		t.Fatalf("dial for another actor: %v, want ErrStale", err)
	}
	c.Detach()

	// The agent is gone: the gate goes on, for what it knows.
	mustAnswer(t, conn, "two", "a two")
	again, err := dialGate(t, addr, "w0", "uid-a", port)
	if err != nil {
		t.Fatalf("a new connection while no agent runs: %v", err)
	}
	again.Close()

	c2 := newClient(t, dir)
	c2.Occupy("w0", ip, "uid-a", slotgate.Freeze{})
	addr2, err := c2.Start(context.Background(), "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	if pid2, _ := running(dir); addr2 != addr || pid2 != pid {
		t.Fatalf("second client: gate %s pid %d, want the running one %s pid %d", addr2, pid2, addr, pid)
	}
	mustAnswer(t, conn, "three", "a three")

	// A new occupant closes the old one's connection before Occupy returns.
	c2.Occupy("w0", ip, "uid-b", slotgate.Freeze{})
	if got, err := roundTrip(conn, "four"); err == nil {
		t.Fatalf("the previous actor's connection answered %q after Occupy", got)
	}
	if err := c2.Exit(); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Fatal("the gate runs after Exit")
	}
	if _, err := os.Stat(SocketPath(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("control socket after Exit: %v", err)
	}
}

// TestGateKilledIsReplaced: a gate killed while the agent runs is
// started again on the same address by Supervise, told every occupant;
// an Occupy that cannot reach the gate starts another before it returns.
func TestGateKilledIsReplaced(t *testing.T) {
	dir := t.TempDir()
	ip, port := echo(t, "a")
	c := newClient(t, dir)
	c.Occupy("w0", ip, "uid-a", slotgate.Freeze{})
	addr, err := c.Start(context.Background(), "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}

	// No supervisor: the Occupy itself finds the gate gone.
	pid, _ := running(dir)
	if err := kill(pid, nil); err != nil {
		t.Fatal(err)
	}
	c.Occupy("w1", ip, "uid-b", slotgate.Freeze{})
	conn, err := dialGate(t, addr, "w1", "uid-b", port)
	if err != nil {
		t.Fatalf("after an Occupy found the gate killed: %v", err)
	}
	conn.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Supervise(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	pid, _ = running(dir)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := dialGate(t, addr, "w0", "uid-a", port)
		if err == nil {
			mustAnswer(t, conn, "x", "a x")
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no gate on %s 10 s after it was killed: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if now, _ := running(dir); now == pid {
		t.Fatal("the killed gate's pid still runs")
	}
}

// TestIncompatibleGateIsReplaced: a gate answering another version is
// stopped and a new one started.
func TestIncompatibleGateIsReplaced(t *testing.T) {
	dir := t.TempDir()
	old, err := net.Listen("unix", SocketPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer func() { old.Close(); wg.Wait() }()
	wg.Go(func() {
		for {
			conn, err := old.Accept()
			if err != nil {
				return
			}
			r := bufio.NewReader(conn)
			var req request
			if readMessage(r, &req) == nil {
				_ = writeMessage(conn, reply{Version: Version + 1, Addr: "127.0.0.1:1"})
			}
			conn.Close()
		}
	})
	c := newClient(t, dir)
	if _, err := c.Start(context.Background(), "127.0.0.1:0", false); err != nil {
		t.Fatal(err)
	}
	_, _, hello, err := dial(dir)
	if err != nil || hello.Version != Version || !hello.Serving {
		t.Fatalf("after Start: %+v, %v; want a serving gate of version %d", hello, err, Version)
	}
	if err := c.Exit(); err != nil {
		t.Fatal(err)
	}
}

// TestServeWaitsForTheAgent: a new gate accepts nothing until told to
// serve, so no connection is refused for an occupant not told yet.
func TestServeWaitsForTheAgent(t *testing.T) {
	g := &recording{}
	served := make(chan struct{})
	c := &control{log: slog.New(slog.DiscardHandler), gate: g, addr: "a:1", serve: func() { close(served) }, exit: func() {}}
	if rep, _ := c.answer(request{Op: opHello}); rep.Serving || rep.Version != Version {
		t.Fatalf("hello: %+v", rep)
	}
	if rep, _ := c.answer(request{Op: opOccupy, Worker: "w0", IP: "10.0.0.2", Actor: "u"}); rep.Error != "" || g.got != "w0 10.0.0.2 u" {
		t.Fatalf("occupy: %+v, gate got %q", rep, g.got)
	}
	select {
	case <-served:
		t.Fatal("serving before serve")
	default:
	}
	c.answer(request{Op: opServe})
	c.answer(request{Op: opServe})
	<-served
	if rep, _ := c.answer(request{Op: opOccupy}); rep.Error == "" {
		t.Fatal("occupy without a worker accepted")
	}
	if rep, _ := c.answer(request{Op: "nope"}); rep.Error == "" {
		t.Fatal("unknown op accepted")
	}
}

type recording struct{ got string }

func (r *recording) Occupy(worker, ip, actor string, f slotgate.Freeze) {
	r.got = worker + " " + ip + " " + actor
	if f.After > 0 {
		r.got += fmt.Sprintf(" %s %s", f.After, f.Control)
	}
}

func (r *recording) Hold(string) (func(), error) { return func() {}, nil }

func (r *recording) States() []slotgate.Change { return nil }

// filePauser is the gate process's pauser in these tests: it appends P
// or R to the file its control names, so the test reads what the gate
// process did.
type filePauser string

func (p filePauser) Pause(context.Context) error  { return p.add("P") }
func (p filePauser) Resume(context.Context) error { return p.add("R") }

func (p filePauser) add(s string) error {
	f, err := os.OpenFile(string(p), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	return errors.Join(err, f.Close())
}

// TestGateProcessFreezes: a gate process freezes an idle slot, tells the
// agent's watch, thaws for the agent's hold, releases a dead agent's
// hold, and a gate started again takes the freeze over from its marker.
func TestGateProcessFreezes(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "pauses")
	ip, _ := echo(t, "a")
	changes := make(chan slotgate.Change, 16)
	c := newClient(t, dir)
	c.cfg.OnChange = func(ch slotgate.Change) { changes <- ch }
	f := slotgate.Freeze{After: 300 * time.Millisecond, Control: log}
	c.Occupy("w0", ip, "uid-a", f)
	if _, err := c.Start(context.Background(), "127.0.0.1:0", false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	supervised := make(chan error, 1)
	go func() { supervised <- c.Supervise(ctx) }()
	defer func() { cancel(); <-supervised }()

	next := func(frozen bool) {
		t.Helper()
		for {
			select {
			case ch := <-changes:
				if ch.Worker == "w0" && ch.ActorUID == "uid-a" && ch.Frozen == frozen {
					return
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no change to frozen=%v", frozen)
			}
		}
	}
	pauses := func() string { b, _ := os.ReadFile(log); return string(b) }
	next(true)
	release, err := c.Hold("w0")
	if err != nil {
		t.Fatal(err)
	}
	next(false)
	if got := pauses(); got != "PR" {
		t.Fatalf("after the hold: %q, want PR", got)
	}
	time.Sleep(600 * time.Millisecond)
	if got := pauses(); got != "PR" {
		t.Fatalf("a held slot froze: %q", got)
	}
	release()
	next(true)

	// An agent that dies holding a slot lets it freeze again.
	c.mu.Lock()
	held := c.call(request{Op: opHold, Worker: "w0"}, nil)
	c.mu.Unlock()
	if held != nil {
		t.Fatal(held)
	}
	next(false)
	c.mu.Lock()
	c.closeConn()
	c.mu.Unlock()
	next(true)
	if got := pauses(); got != "PRPRP" {
		t.Fatalf("pauses %q, want PRPRP", got)
	}

	// The gate killed while the slot is frozen: the next one takes the
	// freeze over from its marker (a thaw, no second pause).
	pid, _ := running(dir)
	if err := kill(pid, nil); err != nil {
		t.Fatal(err)
	}
	next(true) // the new gate's states, as the supervisor re-attaches
	release, err = c.Hold("w0")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if got := pauses(); got != "PRPRPR" {
		t.Fatalf("pauses %q after the gate was replaced, want PRPRPR", got)
	}
}
