package gvisor

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		stat  string
		want  procStat
		fails bool
	}{
		{stat: "42 (runsc-sandbox) S 7 42 42 0 -1 4194560 100 0 0 0 150 50 3 2 20 0 30 0 1234 0 0", want: procStat{ppid: 7, ticks: 205}},
		// A command name with spaces and a parenthesis.
		{stat: "43 (a (b) c) R 42 1 1 0 -1 0 0 0 0 0 1 2 3 4 20 0 1 0 9 0 0", want: procStat{ppid: 42, ticks: 10}},
		{stat: "44 no name S 1", fails: true},
		{stat: "45 (short) S 1 2 3", fails: true},
		{stat: "46 (bad) S x 1 1 0 -1 0 0 0 0 0 1 2 3 4 20", fails: true},
	} {
		got, err := parseProcStat([]byte(tc.stat))
		if (err != nil) != tc.fails || got != tc.want {
			t.Errorf("parseProcStat(%q) = %+v, %v; want %+v (fails: %v)", tc.stat, got, err, tc.want, tc.fails)
		}
	}
}

// TestTreeCPU: a process's time with its descendants', not its
// siblings'.
func TestTreeCPU(t *testing.T) {
	proc := t.TempDir()
	for pid, line := range map[int]string{
		1:  "(init) S 0 0 0 0 -1 0 0 0 0 0 1000 1000 0 0",
		10: "(runsc-sandbox) S 1 0 0 0 -1 0 0 0 0 0 5 5 1 1",
		11: "(stub) S 10 0 0 0 -1 0 0 0 0 0 20 0 0 0",
		12: "(stub) S 11 0 0 0 -1 0 0 0 0 0 0 8 0 0",
		20: "(other) S 1 0 0 0 -1 0 0 0 0 0 500 0 0 0",
	} {
		if err := os.MkdirAll(filepath.Join(proc, fmt.Sprint(pid)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, fmt.Sprint(pid), "stat"), []byte(fmt.Sprintf("%d %s\n", pid, line)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := treeCPU(proc, 10); err != nil || got != 40*clockTick {
		t.Errorf("treeCPU of the sandbox = %v, %v; want %v", got, err, 40*clockTick)
	}
	if _, err := treeCPU(proc, 99); err == nil {
		t.Error("treeCPU of a process that is not there: no error")
	}
}

// TestTreeCPUCountsChildren: on the real proc filesystem, a child that
// spins shows in its parent's tree.
func TestTreeCPUCountsChildren(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	spin := exec.Command(sh, "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		spin.Process.Kill()
		spin.Wait()
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		child, err := treeCPU("/proc", spin.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		self, err := treeCPU("/proc", os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if child >= 100*time.Millisecond {
			if self < child {
				t.Fatalf("the test's tree used %v, less than its child's %v", self, child)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a spinning child used %v in a minute", child)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
