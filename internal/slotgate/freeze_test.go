package slotgate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// fakeSandbox is a workload behind a pauser: it answers each line with
// "paused" while paused (a byte the gate let through before it thawed)
// and "ok" otherwise, and counts the pauses and resumes, panicking as
// gVisor does on a resume with no pause.
type fakeSandbox struct {
	mu              sync.Mutex
	paused          int
	pauses, resumes int
	failPause       error
}

func (s *fakeSandbox) Pause(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failPause != nil {
		return s.failPause
	}
	s.paused++
	s.pauses++
	return nil
}

func (s *fakeSandbox) Resume(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused == 0 {
		panic("Invalid stopCount: -1")
	}
	s.paused--
	s.resumes++
	return nil
}

func (s *fakeSandbox) state() (paused, pauses, resumes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused, s.pauses, s.resumes
}

func (s *fakeSandbox) serve(t *testing.T) (ip string, port int) {
	t.Helper()
	return lineServer(t, func(string) string {
		if p, _, _ := s.state(); p > 0 {
			return "paused\n"
		}
		return "ok\n"
	})
}

// changes collects what a gate notifies.
type changes struct {
	mu  sync.Mutex
	got []Change
}

func (c *changes) add(ch Change) { c.mu.Lock(); c.got = append(c.got, ch); c.mu.Unlock() }
func (c *changes) list() []Change {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Change(nil), c.got...)
}

func freezingGate(t *testing.T, sb *fakeSandbox, dir string) (*Gate, string, *changes) {
	t.Helper()
	ch := &changes{}
	g, addr := startGateWith(t, Options{
		Pausers: func(control string) Pauser {
			if control != "ctl-a" {
				t.Errorf("pauser for %q, want ctl-a", control)
			}
			return sb
		},
		MarkDir: dir,
		Notify:  ch.add,
	})
	return g, addr, ch
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func askLine(t *testing.T, r *bufio.Reader, c net.Conn) string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "hi\n"); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return line
}

func TestGateFreezesIdleSlotsAndThawsForTraffic(t *testing.T) {
	sb := &fakeSandbox{}
	dir := t.TempDir()
	g, addr, ch := freezingGate(t, sb, dir)
	ip, port := sb.serve(t)
	g.Occupy("w0", ip, "uid-a", Freeze{After: 300 * time.Millisecond, Control: "ctl-a"})
	target := Target{Gate: addr, Worker: "w0", ActorUID: "uid-a", Port: port}

	// An open connection that carries nothing does not keep it awake.
	c, err := Dial(context.Background(), &net.Dialer{}, target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	waitFor(t, "the freeze", func() bool { p, _, _ := sb.state(); return p == 1 })
	if _, err := os.Stat(filepath.Join(dir, "w0")); err != nil {
		t.Errorf("no marker for the frozen slot: %v", err)
	}
	if got := g.States(); len(got) != 1 || got[0].Worker != "w0" || got[0].ActorUID != "uid-a" || !got[0].Frozen {
		t.Errorf("States() = %+v, want w0 frozen", got)
	}

	// A byte on that connection thaws the slot before it passes.
	if got := askLine(t, r, c); got != "ok\n" {
		t.Fatalf("answer over a kept connection: %q, want ok (thawed before the byte passed)", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "w0")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("marker of a thawed slot: %v", err)
	}

	// Frozen again; a new connection thaws it too.
	waitFor(t, "the second freeze", func() bool { p, _, _ := sb.state(); return p == 1 })
	c2, err := Dial(context.Background(), &net.Dialer{}, target)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got := askLine(t, bufio.NewReader(c2), c2); got != "ok\n" {
		t.Fatalf("answer over a new connection: %q, want ok", got)
	}
	_, pauses, resumes := sb.state()
	if pauses != 2 || resumes != 2 {
		t.Errorf("pauses %d, resumes %d; want 2 and 2", pauses, resumes)
	}
	want := []bool{true, false, true, false}
	got := ch.list()
	if len(got) != len(want) {
		t.Fatalf("notified %+v, want frozen/thawed %v", got, want)
	}
	for i, c := range got {
		if c.Frozen != want[i] || c.Worker != "w0" || c.ActorUID != "uid-a" {
			t.Errorf("change %d: %+v, want frozen=%v", i, c, want[i])
		}
	}
}

// frozenSlot has g's slot w0 host uid-a on sb (freezing after 200 ms)
// and waits until it is frozen; it returns the workload's address and
// the slot's freeze.
func frozenSlot(t *testing.T, g *Gate, sb *fakeSandbox) (ip string, port int, f Freeze) {
	t.Helper()
	ip, port = sb.serve(t)
	f = Freeze{After: 200 * time.Millisecond, Control: "ctl-a"}
	g.Occupy("w0", ip, "uid-a", f)
	waitFor(t, "the freeze", func() bool { p, _, _ := sb.state(); return p == 1 })
	return ip, port, f
}

func TestGateHoldKeepsASlotAwake(t *testing.T) {
	sb := &fakeSandbox{}
	g, _, _ := freezingGate(t, sb, t.TempDir())
	frozenSlot(t, g, sb)

	release, err := g.Hold("w0")
	if err != nil {
		t.Fatal(err)
	}
	if p, _, _ := sb.state(); p != 0 {
		t.Fatal("Hold returned with the slot still frozen")
	}
	time.Sleep(600 * time.Millisecond)
	if p, pauses, _ := sb.state(); p != 0 || pauses != 1 {
		t.Fatalf("a held slot was frozen (paused %d, pauses %d)", p, pauses)
	}
	release()
	release() // a second call does nothing
	waitFor(t, "the freeze after the hold", func() bool { p, _, _ := sb.state(); return p == 1 })

	// A slot that hosts nothing, or does not freeze, holds trivially.
	for _, w := range []string{"w9"} {
		if release, err := g.Hold(w); err != nil {
			t.Errorf("hold %s: %v", w, err)
		} else {
			release()
		}
	}
}

func TestGateTakesOverAFreezeFromItsMarker(t *testing.T) {
	sb := &fakeSandbox{}
	dir := t.TempDir()
	g, _, _ := freezingGate(t, sb, dir)
	ip, port, f := frozenSlot(t, g, sb)

	// Another gate (a restarted agent or gate process) on the same state,
	// the first one left alone as a dead one would be: it thaws what the
	// first one froze, with one resume and no pause.
	g2, addr2, _ := freezingGate(t, sb, dir)
	g2.Occupy("w0", ip, "uid-a", f)
	if got := g2.States(); len(got) != 1 || !got[0].Frozen {
		t.Fatalf("the new gate does not know the slot is frozen: %+v", got)
	}
	c, err := Dial(context.Background(), &net.Dialer{}, Target{Gate: addr2, Worker: "w0", ActorUID: "uid-a", Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := askLine(t, bufio.NewReader(c), c); got != "ok\n" {
		t.Fatalf("answer through the new gate: %q, want ok", got)
	}
	if _, pauses, resumes := sb.state(); pauses != 1 || resumes != 1 {
		t.Errorf("pauses %d, resumes %d; want 1 and 1", pauses, resumes)
	}
}

// TestGateThawsAFrozenSlotThatChangesHands: what still has the sandbox
// of a slot that changes hands (a checkpoint's capture, a terminate)
// needs it running.
func TestGateThawsAFrozenSlotThatChangesHands(t *testing.T) {
	sb := &fakeSandbox{}
	dir := t.TempDir()
	g, _, _ := freezingGate(t, sb, dir)
	ip, _, _ := frozenSlot(t, g, sb)
	g.Occupy("w0", ip, "", Freeze{})
	if _, err := os.Stat(filepath.Join(dir, "w0")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("marker of a slot that changed hands: %v", err)
	}
	if paused, _, resumes := sb.state(); paused != 0 || resumes != 1 {
		t.Errorf("paused %d, %d resumes; want the sandbox thawed once", paused, resumes)
	}
	time.Sleep(500 * time.Millisecond)
	if _, pauses, _ := sb.state(); pauses != 1 {
		t.Errorf("%d pauses: the slot's former sandbox was frozen again", pauses)
	}
	if got := g.States(); len(got) != 0 {
		t.Errorf("States() = %+v after the slot changed hands", got)
	}
}

func TestGateFreezeThatFailsLeavesTheSlotAwake(t *testing.T) {
	sb := &fakeSandbox{failPause: errors.New("sandbox gone")}
	dir := t.TempDir()
	g, addr, ch := freezingGate(t, sb, dir)
	ip, port := sb.serve(t)
	g.Occupy("w0", ip, "uid-a", Freeze{After: 100 * time.Millisecond, Control: "ctl-a"})
	time.Sleep(500 * time.Millisecond)
	if got := ch.list(); len(got) != 0 {
		t.Errorf("notified %+v for a freeze that failed", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "w0")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("marker left by a freeze that failed: %v", err)
	}
	c, err := Dial(context.Background(), &net.Dialer{}, Target{Gate: addr, Worker: "w0", ActorUID: "uid-a", Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := askLine(t, bufio.NewReader(c), c); got != "ok\n" {
		t.Fatalf("answer: %q", got)
	}
	if _, _, resumes := sb.state(); resumes != 0 {
		t.Errorf("%d resumes after failed pauses", resumes)
	}
}

func TestThawMarked(t *testing.T) {
	sb := &fakeSandbox{}
	dir := t.TempDir()
	g, _, _ := freezingGate(t, sb, dir)
	frozenSlot(t, g, sb)
	// The gate is gone (a cleanup stopped it); what it froze is thawed.
	thawed, err := ThawMarked(context.Background(), dir, func(control string) Pauser {
		if control != "ctl-a" {
			t.Errorf("pauser for %q", control)
		}
		return sb
	})
	if err != nil || len(thawed) != 1 || thawed[0] != "w0" {
		t.Fatalf("ThawMarked: %v, %v; want [w0]", thawed, err)
	}
	if p, _, resumes := sb.state(); p != 0 || resumes != 1 {
		t.Fatalf("paused %d, resumes %d after ThawMarked", p, resumes)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("markers left: %v", entries)
	}
	if thawed, err := ThawMarked(context.Background(), filepath.Join(dir, "none"), nil); err != nil || len(thawed) != 0 {
		t.Errorf("no marker directory: %v, %v", thawed, err)
	}
}

// TestGateDoesNotFreezeUnderARequest: a request the workload has not
// answered yet keeps the slot awake however long the answer takes; once
// answered, the kept connection does not.
func TestGateDoesNotFreezeUnderARequest(t *testing.T) {
	sb := &fakeSandbox{}
	g, addr, _ := freezingGate(t, sb, t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	answer := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		if _, err := r.ReadString('\n'); err != nil {
			return
		}
		<-answer // a slow answer: a long computation
		fmt.Fprintln(c, "done")
		_, _ = io.Copy(io.Discard, r)
	}()
	a := ln.Addr().(*net.TCPAddr)
	g.Occupy("w0", a.IP.String(), "uid-a", Freeze{After: 200 * time.Millisecond, Control: "ctl-a"})
	c, err := Dial(context.Background(), &net.Dialer{}, Target{Gate: addr, Worker: "w0", ActorUID: "uid-a", Port: a.Port})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "compute\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(800 * time.Millisecond)
	if _, pauses, _ := sb.state(); pauses != 0 {
		t.Fatalf("frozen %d times under a request not answered yet", pauses)
	}
	close(answer)
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "done\n" {
		t.Fatalf("answer: %q, %v", line, err)
	}
	waitFor(t, "the freeze once answered", func() bool { p, _, _ := sb.state(); return p == 1 })
}
