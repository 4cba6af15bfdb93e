package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
)

// buildShellImage packs this machine's dash (as /bin/sh) and a few
// coreutils with the shared libraries they load into an OCI layout under
// dir, and returns the pinned reference.
func buildShellImage(t testing.TB, dir string) string {
	t.Helper()
	files := map[string]string{}
	addPrograms(t, files, map[string]string{"/bin/sh": "dash", "/bin/cat": "cat", "/bin/false": "false", "/bin/sleep": "sleep"})
	layout := filepath.Join(dir, "shell-image")
	digest, err := image.BuildLayout(t.Context(), layout, image.LayoutSpec{
		Files:  files,
		Dirs:   map[string]fs.FileMode{"/data": 0o755, "/tmp": fs.ModeSticky | 0o777},
		Config: v1.Config{Entrypoint: []string{"/bin/sh"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return image.LayoutScheme + layout + "@" + digest.String()
}

// lineWriter writes "line N" every 200 ms to its output and to
// /data/lines, from 1 on, or on from the last line a restore kept.
func lineWriter(pinned string) *torporv1.Template {
	script := `i=$(cat /data/lines 2>/dev/null | while read -r _ n; do echo "$n"; done | tail -n 1 2>/dev/null); i=${i:-0}
while :; do i=$((i+1)); echo "line $i"; echo "line $i" >> /data/lines; sleep 0.2; done`
	return &torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "lines"}, Spec: &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers: []*torporv1.Container{{
			Name: "writer", Image: pinned, Command: []string{"/bin/sh", "-c", script},
			Mounts: []*torporv1.Mount{{Volume: "data", Path: "/data"}},
		}},
		Volumes: []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
	}}
}

// TestExecAndStats: `torpor actor exec` runs commands in a real gVisor
// sandbox with the command's exit status, interactively on a terminal
// too, resuming a suspended actor; `torpor actor stats` shows its use and
// snapshots; a token of another space is refused both.
func TestExecAndStats(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite"})
	c.applyTemplate(lineWriter(buildShellImage(t, t.TempDir())))
	c.createActor("c1", "lines")
	token := c.apiToken("default")
	c.mustResume("c1")

	// The first number may be past 1: the guest's memory comes from the
	// golden snapshot, its volume does not.
	var lines string
	c.waitFor("lines in /data/lines", func() bool {
		out, err := c.torporAs(token, "actor", "exec", "c1", "--", "cat", "/data/lines").Output()
		lines = string(out)
		return err == nil && strings.Count(lines, "\n") >= 2
	})
	var first, second int
	if _, err := fmt.Sscanf(lines, "line %d\nline %d\n", &first, &second); err != nil || second != first+1 {
		t.Fatalf("exec cat /data/lines printed %q", lines)
	}

	err := c.torporAs(token, "actor", "exec", "c1", "--", "false").Run()
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exec false: %v, want exit status 1", err)
	}
	out, err := c.torporAs(token, "actor", "exec", "c1", "-i", "--", "cat").Output()
	if err != nil || len(out) != 0 {
		t.Fatalf("exec -i cat with no input: %v, %q", err, out)
	}
	cmd := c.torporAs(token, "actor", "exec", "c1", "-i", "--", "sh", "-c", "cat; echo; echo done >&2")
	cmd.Stdin = strings.NewReader("piped in")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil || string(out) != "piped in\n" || stderr.String() != "done\n" {
		t.Fatalf("exec -i: %v, stdout %q, stderr %q", err, out, stderr.String())
	}

	interactive(t, c.torporAs(token, "actor", "exec", "c1", "-it", "--", "sh"))

	// A caller who leaves takes its process with it.
	processes := func() string {
		t.Helper()
		out, err := c.torporAs(token, "actor", "exec", "c1", "--", "sh", "-c", `for f in /proc/[0-9]*/cmdline; do cat "$f"; echo; done`).Output()
		if err != nil {
			t.Fatalf("listing processes: %v", err)
		}
		return string(out)
	}
	sleeper := c.torporAs(token, "actor", "exec", "c1", "--", "sleep", "1000")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	c.waitFor("sleep 1000 in the actor", func() bool { return strings.Contains(processes(), "sleep\x001000") })
	sleeper.Process.Kill()
	sleeper.Wait()
	c.waitFor("sleep 1000 to end with its caller", func() bool { return !strings.Contains(processes(), "sleep\x001000") })

	// -o json names enum values as users see them (RUNNING).
	var st map[string]any
	statsOf := func() {
		t.Helper()
		out, err := c.torporAs(token, "actor", "stats", "c1", "-o", "json").Output()
		if err != nil {
			t.Fatalf("stats: %v", err)
		}
		st = nil
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatalf("stats -o json: %v: %s", err, out)
		}
	}
	num := func(field string) float64 {
		switch v := st[field].(type) {
		case float64:
			return v
		case string: // 64-bit integers are strings in JSON
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
		return 0
	}
	statsOf()
	if st["state"] != "RUNNING" || num("memoryBytes") <= 0 || num("cpuSeconds") <= 0 || st["started"] == nil {
		t.Fatalf("stats of a running actor: %v", st)
	}
	c.suspend("c1")
	statsOf()
	if st["state"] != "SUSPENDED" || num("snapshots") < 1 || num("latestSnapshotBytes") <= 0 || num("snapshotsBytes") < num("latestSnapshotBytes") || num("memoryBytes") != 0 {
		t.Fatalf("stats of a suspended actor: %v", st)
	}
	if got := c.actor("c1").GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("stats resumed the actor: %s", got)
	}
	// Exec on a suspended actor resumes it; the lines it wrote survived.
	out, err = c.torporAs(token, "actor", "exec", "c1", "--", "cat", "/data/lines").Output()
	if err != nil || !strings.HasPrefix(string(out), lines) {
		t.Fatalf("exec in a suspended actor: %v, %q", err, out)
	}
	if got := c.actor("c1").GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("after exec in a suspended actor: %s, want RUNNING", got)
	}

	other := c.apiToken("other")
	for _, args := range [][]string{
		{"actor", "exec", "c1", "--", "cat", "/data/lines"},
		{"actor", "exec", "c1", "-it", "--", "sh"},
		{"actor", "logs", "c1"},
		{"actor", "stats", "c1"},
	} {
		out, err := c.torporAs(other, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "permission_denied") {
			t.Errorf("%s with a token of another space: %v\n%s\nwant permission_denied", strings.Join(args, " "), err, out)
		}
	}
}

// interactive runs cmd (exec -it sh) on a pseudo-terminal, types two
// commands into the shell and expects the second's status.
func interactive(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	tty, err := pty.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	output := make(chan string, 100)
	go func() {
		defer close(output)
		r := bufio.NewReader(tty)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				output <- line
			}
			if err != nil {
				return
			}
		}
	}()
	// The terminal echoes what is typed ("echo $((6*7))"); the result
	// (42) alone proves the shell ran it.
	if _, err := tty.WriteString("echo $((6*7))\n"); err != nil {
		t.Fatal(err)
	}
	var seen strings.Builder
	deadline := time.After(time.Minute)
	for found := false; !found; {
		select {
		case line, ok := <-output:
			seen.WriteString(line)
			if !ok {
				t.Fatalf("exec -it sh ended early:\n%s", seen.String())
			}
			// After the prompt ("# 42"), which the shell prints before
			// it reads the line typed ahead.
			found = strings.HasSuffix(strings.TrimSpace(line), "42") && !strings.Contains(line, "*")
		case <-deadline:
			t.Fatalf("exec -it sh: no answer:\n%s", seen.String())
		}
	}
	if _, err := tty.WriteString("exit 3\n"); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("exec -it sh, exit 3: %v\n%s", err, seen.String())
	}
}

// TestLogs: `torpor actor logs` shows an actor's output from before and
// after two suspends and a move to another node, with torpor's records
// where it stopped and resumed; -f follows past a suspend.
func TestLogs(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", nodes: 2, workersPerNode: 1})
	c.applyTemplate(lineWriter(buildShellImage(t, t.TempDir())))
	for _, name := range []string{"c1", "c2", "c3"} {
		c.createActor(name, "lines")
	}
	token := c.apiToken("default")
	logs := func(args ...string) string {
		t.Helper()
		out, err := c.torporAs(token, append([]string{"actor", "logs", "c1"}, args...)...).Output()
		if err != nil {
			t.Fatalf("logs %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	lastLine := func() int {
		t.Helper()
		n := 0
		for _, l := range strings.Split(logs("-c", "writer"), "\n") {
			if _, num, ok := strings.Cut(l, " writer line "); ok {
				fmt.Sscan(num, &n)
			}
		}
		return n
	}
	c.mustResume("c1")
	c.waitFor("lines in the log", func() bool { return lastLine() >= 3 })

	follow := c.torporAs(token, "actor", "logs", "c1", "-f", "--tail", "1")
	stdout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	f := &followed{done: make(chan struct{})}
	go f.read(stdout)
	before := lastLine()
	c.waitFor("more lines", func() bool { return lastLine() >= before+3 })
	c.suspend("c1")
	// The follow goes on past the suspend (TestReadsNeverWake follows
	// across resumes).
	c.waitFor("the suspend followed", func() bool { return strings.Contains(f.text(), " -- suspended") })
	select {
	case <-f.done:
		t.Fatalf("logs -f ended at the suspend:\n%s", f.text())
	case <-time.After(followPollWait):
	}
	follow.Process.Kill()
	follow.Wait()
	if got := strings.Split(f.text(), "\n"); len(got) < 4 || !strings.Contains(got[len(got)-1], " -- suspended") {
		t.Fatalf("logs -f printed:\n%s\nwant new lines, then the suspend", f.text())
	}

	// Second suspend, then a move: the other node's worker is the only
	// free one when c1 resumes.
	first := c.mustResume("c1").GetStatus().GetWorker()
	before = lastLine()
	c.waitFor("lines after the first resume", func() bool { return lastLine() >= before+3 })
	c.suspend("c1")
	for _, name := range []string{"c2", "c3"} {
		c.mustResume(name)
	}
	for _, name := range []string{"c2", "c3"} {
		if c.actor(name).GetStatus().GetWorker().GetName() != first.GetName() {
			c.suspend(name)
		}
	}
	moved := c.mustResume("c1").GetStatus().GetWorker()
	if moved.GetNode() == first.GetNode() {
		t.Fatalf("c1 resumed on node %s again, want the other one", moved.GetNode())
	}
	before = lastLine()
	c.waitFor("lines after the move", func() bool { return lastLine() >= before+3 })

	all := logs()
	var markers []string
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(all), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			t.Fatalf("log line %q", l)
		}
		if _, err := time.Parse(time.RFC3339, f[0]); err != nil {
			t.Fatalf("log line %q has no time: %v", l, err)
		}
		if f[1] == "--" {
			markers = append(markers, f[2])
			continue
		}
		var num int
		if _, err := fmt.Sscanf(strings.Join(f[1:], " "), "writer line %d", &num); err != nil || n != 0 && num != n+1 {
			t.Fatalf("log line %q after line %d:\n%s", l, n, all)
		}
		n = num
	}
	// The first start restores the template's golden snapshot, or boots
	// while it is not ready.
	if want := []string{"resumed", "suspended", "resumed", "suspended", "resumed"}; len(markers) != len(want) || !slices.Equal(markers[1:], want[1:]) || markers[0] != "started" && markers[0] != "resumed" {
		t.Fatalf("torpor's records %q, want %q:\n%s", markers, want, all)
	}
	if !strings.Contains(all, "resumed (restored) on node "+moved.GetNode()) {
		t.Fatalf("the last resume does not name node %s:\n%s", moved.GetNode(), all)
	}
	if tail := strings.Split(strings.TrimSpace(logs("--tail", "2")), "\n"); len(tail) != 2 {
		t.Fatalf("logs --tail 2: %q", tail)
	}
	t.Logf("%d lines over two suspends and a move from %s to %s", n, first.GetNode(), moved.GetNode())
}
